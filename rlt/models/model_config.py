"""ModelConfig: what the checkpoint is, built once by the entry point from config.json: the family's
own config object and the family-neutral facts the coordinator (validation, credits) and the
workers (KV pool, runner) need. Workers receive it; they never re-read config.json.
"""

import os
from dataclasses import dataclass
from typing import Any

from rlt.errors import ConfigError
from rlt.models.configs import FamilyConfig
from rlt.models.family import FAMILIES
from rlt.models.json_object import read_json_object

# raw's key for the engine's context cap (EngineConfig.max_model_len): in raw, so a worker
# rebuilding
# the ModelConfig from the handshake's config dict gets the same max_positions as the coordinator
MAX_MODEL_LEN_KEY = "rlt_max_model_len"

# bytes of one weight or KV element of each dtype the engine runs in
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def dtype_name(dtype: str | None, device: str, checkpoint_dtype: str) -> str:
    """None picks float32 on CPU (exact reference numerics) and the checkpoint's half type on
    GPU."""
    if dtype is not None:
        return dtype
    if device.startswith("cuda"):
        return "float16" if checkpoint_dtype == "float16" else "bfloat16"
    return "float32"


@dataclass(frozen=True)
class KVGeometry:
    """What one token position stores. Core layers keep one plane per loop depth (LAST_EXITED) or
    one shared plane; boundary layers (Huginn's prelude and coda) are stored once."""

    num_core_layers: int
    num_boundary_layers: int
    num_kv_heads: int
    head_dim: int

    def bytes_per_token(self, planes: int, dtype_bytes: int) -> int:
        layers = self.num_core_layers * planes + self.num_boundary_layers
        return 2 * layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def block_bytes(self, block_size: int, dtype_bytes: int) -> int:
        """One physical block: block_size positions of every layer of one plane (core or boundary)."""
        layers = max(self.num_core_layers, self.num_boundary_layers)
        return 2 * layers * self.num_kv_heads * self.head_dim * dtype_bytes * block_size


@dataclass(frozen=True)
class ModelConfig:
    path: str
    model_type: str  # config.json's model_type: a key of rlt.models.family.FAMILIES
    # config.json parsed by the family's own config class (its config_cls)
    family_config: FamilyConfig
    # config.json after hf_overrides, and the context cap (what a worker rebuilds this from)
    raw: dict[str, Any]
    torch_dtype: str  # the checkpoint's declared dtype

    @classmethod
    def from_pretrained(
        cls, path: str, hf_overrides: dict | None = None, revision: str | None = None
    ) -> "ModelConfig":
        """path: a checkpoint directory, or a Hugging Face Hub id (rlt/models/hub.py; revision: its
        branch, tag or commit)."""
        if not isinstance(path, (str, os.PathLike)):
            raise ConfigError(
                f"model must be a checkpoint directory's path or a hub id, got {path!r}"
            )
        from rlt.models.hub import resolve

        path = os.path.abspath(resolve(os.fspath(path), revision))
        if not os.path.isdir(path):
            raise ConfigError(
                f"model path {path} is not a directory"
                if os.path.exists(path)
                else f"model path {path} does not exist"
            )
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ConfigError(f"model path {path} has no config.json (not a checkpoint directory?)")
        raw = read_json_object(os.path.join(path, "config.json"))
        if hf_overrides is not None:
            if not isinstance(hf_overrides, dict):
                raise ConfigError(
                    f"hf_overrides must be a dict of config.json fields, got {hf_overrides!r}"
                )
            raw = {**raw, **hf_overrides}
        gen = os.path.join(path, "generation_config.json")
        if os.path.isfile(gen):  # generate() stops on generation_config.json's eos ids too
            gen_eos = read_json_object(gen).get("eos_token_id")
            if gen_eos is not None:
                ids = lambda v: v if isinstance(v, list) else [] if v is None else [v]  # noqa: E731
                merged = list(dict.fromkeys(ids(raw.get("eos_token_id")) + ids(gen_eos)))
                raw = {**raw, "eos_token_id": merged[0] if len(merged) == 1 else merged}
        return cls.from_dict(raw, path)

    @classmethod
    def from_dict(cls, raw: dict, path: str = "") -> "ModelConfig":
        model_type = raw.get("model_type")
        if model_type not in FAMILIES:
            raise ConfigError(
                f"config.json field 'model_type': {model_type!r} is not supported "
                f"(supported: {', '.join(map(repr, FAMILIES))})"
            )
        fc = FAMILIES[model_type].config_cls.from_dict(raw)
        cap = raw.get(MAX_MODEL_LEN_KEY)
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ConfigError(f"max_model_len must be an integer >= 1, got {cap!r}")
        if cap is not None and cap > fc.max_position_embeddings:
            raise ConfigError(
                f"max_model_len {cap} is more than the model's max positions {fc.max_position_embeddings} "
                "(config.json's max_position_embeddings)"
            )
        return cls(
            path=path,
            model_type=model_type,
            family_config=fc,
            raw=raw,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        )

    # ---- family-neutral facts --------------------------------------------------------------------
    @property
    def family(self) -> str:
        return FAMILIES[self.model_type].name

    @property
    def vocab_size(self) -> int:
        return self.family_config.vocab_size

    @property
    def hidden_size(self) -> int:
        """Width of the loop state (what a row hands over between loops or workers)."""
        return self.family_config.hidden_size

    @property
    def depth(self) -> int:
        """Loop depth a prompt runs at (and the most a decode token may run)."""
        return self.family_config.depth

    @property
    def has_exit_gate(self) -> bool:
        return self.family_config.has_exit_gate

    @property
    def has_exit_criteria(self) -> bool:
        return self.family_config.has_exit_criteria

    @property
    def default_exit_threshold(self) -> float:
        return self.family_config.default_exit_threshold

    @property
    def max_positions(self) -> int:
        """Positions a request may use, prompt and output: max_model_len where the engine caps it,
        else the model's own (every check, on the coordinator and the workers, reads this)."""
        return self.raw.get(MAX_MODEL_LEN_KEY) or self.model_max_positions

    @property
    def model_max_positions(self) -> int:
        """The checkpoint's max_position_embeddings, whatever the cap."""
        return self.family_config.max_position_embeddings

    @property
    def max_model_len(self) -> int | None:
        """The engine's cap on max_positions (EngineConfig.max_model_len), if any."""
        return self.raw.get(MAX_MODEL_LEN_KEY)

    def with_max_model_len(self, max_model_len: int | None) -> "ModelConfig":
        """This model with its context capped at max_model_len positions (None: as it is; larger than
        the model's: ConfigError naming both)."""
        if max_model_len is None:
            return self
        return ModelConfig.from_dict({**self.raw, MAX_MODEL_LEN_KEY: max_model_len}, self.path)

    @property
    def bos_token_id(self) -> int | None:
        return self.family_config.bos_token_id

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.family_config.eos_token_ids

    @property
    def kv(self) -> KVGeometry:
        fc = self.family_config
        core, boundary = fc.kv_layers
        return KVGeometry(core, boundary, fc.num_key_value_heads, fc.head_dim)
