"""The three families' config.json schemas, parsed and validated (no torch here).

Each class reads the official field names, fills the official defaults, and rejects what the
engine cannot run with a ConfigError that names the field. Fields that are present but inactive
(e.g. Huginn's `test_time_noise: 0`, Ouro's `sliding_window` with `use_sliding_window: false`)
are accepted. Unknown keys are ignored, as transformers does. Each class also derives the
family-neutral facts (FamilyConfig: depth, exit gate, KV layer counts) from its own fields.
"""

import math
from dataclasses import dataclass
from typing import ClassVar

from rlt.models.config_reader import Reader as _Reader


@dataclass(frozen=True)
class FamilyConfig:
    """The fields every family has, and the family-neutral facts that ModelConfig reads: each
    family derives them from its own fields."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    # a learned gate that may end a token's loops early (Ouro)
    has_exit_gate: ClassVar[bool] = False
    # Huginn's convergence criteria (rlt/workers/exit_criteria.py)
    has_exit_criteria: ClassVar[bool] = False

    @property
    def random_initial_state(self) -> bool:
        """The loop's initial latent is drawn from the request's state seed (its KV depends on it)."""
        return False

    @property
    def depth(self) -> int:
        """Loop depth a prompt runs at (and the most a decode token may run)."""
        raise NotImplementedError

    @property
    def default_exit_threshold(self) -> float:
        """The exit threshold of a request that sets none; 1.0 runs every token to full depth."""
        return 1.0

    @property
    def kv_layers(self) -> tuple[int, int]:
        """(core layers, stored per loop depth; boundary layers, stored once per position)."""
        raise NotImplementedError


def _heads(
    r: _Reader,
    hidden: int,
    heads_key: str,
    kv_key: str,
    head_dim_keys: tuple[str, ...],
    kv_if_absent: int | None = None,
):
    """As the reference config classes: kv heads absent -> kv_if_absent (Qwen2's class default, for
    Ouro) else the head count; explicit null -> the head count; head_dim absent -> hidden // heads."""
    heads = r.positive(heads_key)
    kv = r.positive(kv_key, heads if kv_if_absent is None or kv_key in r.d else kv_if_absent)
    if heads % kv:
        raise r.fail(kv_key, f"{kv} must divide {heads_key}={heads}")
    for key in head_dim_keys:
        if r.d.get(key) is not None:
            return heads, kv, r.positive(key)
    if hidden % heads:
        raise r.fail(heads_key, f"{heads} must divide the hidden size {hidden} (or give head_dim)")
    return heads, kv, hidden // heads


def _bos(r: _Reader) -> int | None:
    ids = r.token_ids("bos_token_id")
    return ids[0] if ids else None


def _llama_fields(
    r: _Reader,
    *,
    kv_if_absent: int | None,
    max_positions: int,
    bos: int | None,
    eos: tuple[int, ...],
) -> dict:
    """The FamilyConfig fields as Ouro's (Qwen2) and Nanbeige's (Llama) config classes read them; the
    keyword arguments are each class's defaults for fields absent from config.json."""
    hidden = r.positive("hidden_size")
    heads, kv, hd = _heads(
        r, hidden, "num_attention_heads", "num_key_value_heads", ("head_dim",), kv_if_absent
    )
    return dict(
        vocab_size=r.positive("vocab_size"),
        hidden_size=hidden,
        intermediate_size=r.positive("intermediate_size"),
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=hd,
        rope_theta=r.rope_theta(default=10000.0),
        rms_norm_eps=r.get("rms_norm_eps", float, 1e-6),
        max_position_embeddings=r.positive("max_position_embeddings", max_positions),
        tie_word_embeddings=r.get("tie_word_embeddings", bool, False),
        bos_token_id=_bos(r) if "bos_token_id" in r.d else bos,
        eos_token_ids=r.token_ids("eos_token_id") if "eos_token_id" in r.d else eos,
    )


@dataclass(frozen=True)
class OuroConfig(FamilyConfig):
    num_hidden_layers: int
    total_ut_steps: int
    early_exit_threshold: float

    has_exit_gate: ClassVar[bool] = True

    @property
    def depth(self) -> int:
        return self.total_ut_steps

    @property
    def default_exit_threshold(self) -> float:
        return self.early_exit_threshold

    @property
    def kv_layers(self) -> tuple[int, int]:
        return self.num_hidden_layers, 0

    @classmethod
    def from_dict(cls, d: dict) -> "OuroConfig":
        r = _Reader(d, "ouro")
        r.must_be("hidden_act", ("silu",), "silu")
        r.off("use_sliding_window")
        r.off("early_exit_step", " (per-request exit_threshold / max_loops select the depth)")
        layers = r.positive("num_hidden_layers")
        types = r.get("layer_types", list, [])
        if any(t != "full_attention" for t in types):
            raise r.fail("layer_types", "only 'full_attention' layers are supported")
        thr = r.get("early_exit_threshold", float, 1.0)
        if not 0.0 <= thr <= 1.0:
            raise r.fail("early_exit_threshold", f"must be in [0, 1], got {thr}")
        return cls(
            **_llama_fields(r, kv_if_absent=32, max_positions=32768, bos=None, eos=()),
            num_hidden_layers=layers,
            total_ut_steps=r.positive("total_ut_steps", 4),
            early_exit_threshold=thr,
        )


# Nanbeige's superset features (all off in Nanbeige4.2); any of them enabled is rejected.
NANBEIGE_UNSUPPORTED = (
    "enable_double_loop_split",
    "loop_share_kv",
    "mhc_diff_for_loop",
    "enable_hyper_connection",
    "enable_mhc",
    "enable_h_res_identity",
    "enable_depth_attention",
    "qk_layernorm",
    "emb_neighbor_num",
    "emb_split_num",
    "ngram_vocab_size_ratio",
    "ngram_embedding_hidden_size",
    "insert_ngram_layer_idx",
    "ngram_insert_all_layers",
    "attention_bias",
    "mlp_bias",
    "loop_middle_layers",
)


@dataclass(frozen=True)
class NanbeigeConfig(FamilyConfig):
    num_hidden_layers: int
    num_loops: int
    skip_loop_final_norm: bool

    @property
    def depth(self) -> int:
        return self.num_loops

    @property
    def kv_layers(self) -> tuple[int, int]:
        return self.num_hidden_layers, 0

    @classmethod
    def from_dict(cls, d: dict) -> "NanbeigeConfig":
        r = _Reader(d, "nanbeige")
        r.must_be("hidden_act", ("silu",), "silu")
        for name in NANBEIGE_UNSUPPORTED:
            r.off(name)
        # In the reference code a non-empty loop_loss_weights silently overrides num_loops.
        r.off("loop_loss_weights", " (it is training-only; set num_loops instead)")
        # kv_channels rides along in the released config but the reference code never reads it.
        return cls(
            **_llama_fields(r, kv_if_absent=None, max_positions=2048, bos=1, eos=(2,)),
            num_hidden_layers=r.positive("num_hidden_layers"),
            num_loops=r.positive("num_loops", 1),
            skip_loop_final_norm=r.get("skip_loop_final_norm", bool, False),
        )


@dataclass(frozen=True)
class HuginnConfig(FamilyConfig):
    has_exit_criteria: ClassVar[bool] = True
    n_layers_in_prelude: int
    n_layers_in_recurrent_block: int
    n_layers_in_coda: int
    mean_recurrence: int
    qk_bias: bool
    state_init: str
    embed_scale: float
    state_std: float

    @property
    def depth(self) -> int:
        return self.mean_recurrence

    @property
    def random_initial_state(self) -> bool:
        return self.state_init == "like-init"

    @property
    def kv_layers(self) -> tuple[int, int]:
        """The recurrent block is the core; prelude and coda are boundary layers."""
        return self.n_layers_in_recurrent_block, self.n_layers_in_prelude + self.n_layers_in_coda

    @classmethod
    def from_dict(cls, d: dict) -> "HuginnConfig":
        # RavenConfig's attribute_map: the HF aliases name the same fields.
        aliases = {
            "hidden_size": "n_embd",
            "num_attention_heads": "n_heads",
            "num_hidden_layers": "n_layers",
        }
        d = {**{v: d[k] for k, v in aliases.items() if k in d and v not in d}, **d}
        r = _Reader(d, "huginn_raven")
        r.must_be("injection_type", ("linear",), "linear")
        r.must_be("block_class_name", ("SandwichBlock",), "SandwichBlock")
        r.must_be("norm_class_name", ("RMSNorm_llama",), "RMSNorm_llama")
        r.must_be("mlp_class_name", ("GatedMLP",), "GatedMLP")
        r.must_be("nonlin_name", ("SiLU",), "SiLU")
        r.must_be("state_init", ("like-init", "zero"), "like-init")
        r.off("bias")
        r.off("test_time_noise")
        hidden = r.positive("n_embd")
        heads, kv, hd = _heads(r, hidden, "n_heads", "num_key_value_heads", ())
        if kv != heads:
            raise r.fail("num_key_value_heads", f"{kv} != n_heads={heads}: Huginn attention is MHA")
        prelude = r.positive("n_layers_in_prelude", 2)
        core = r.positive("n_layers_in_recurrent_block", 4)
        coda = r.positive("n_layers_in_coda", 2)
        n_layers = r.get("n_layers", int, prelude + core + coda)
        if n_layers != prelude + core + coda:
            raise r.fail(
                "n_layers",
                f"{n_layers} != prelude {prelude} + recurrent block {core} + coda {coda}",
            )
        vocab = r.positive("padded_vocab_size", r.positive("vocab_size"))
        # init_values as the reference reads them; derived from n_embd when absent.
        init = r.get("init_values", dict, {})
        std = math.sqrt(2.0 / (5.0 * hidden))
        embed_scale = float(init.get("embed_scale", math.sqrt(hidden)))
        state_std = float(init.get("std", std))
        tie = r.get("tie_embeddings", bool, True)
        if not tie:
            raise r.fail("tie_embeddings", "false is not supported: Huginn's head is the embedding")
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=r.positive("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=hd,
            rope_theta=r.rope_theta("rope_base", default=50000.0),
            rms_norm_eps=r.get("norm_eps", float, 1e-6),
            max_position_embeddings=r.positive("block_size", 4096),
            tie_word_embeddings=True,
            bos_token_id=_bos(r),
            eos_token_ids=r.token_ids("eos_token_id"),
            n_layers_in_prelude=prelude,
            n_layers_in_recurrent_block=core,
            n_layers_in_coda=coda,
            mean_recurrence=r.positive("mean_recurrence", 32),
            qk_bias=r.get("qk_bias", bool, True),
            state_init=r.d.get("state_init", "like-init"),
            embed_scale=embed_scale,
            state_std=state_std,
        )
