"""The options: EngineConfig (how a worker runs the model) and LaunchConfig (how the coordinator
runs the workers); what the checkpoint is, ModelConfig, lives with the models
(rlt/models/model_config.py).
"""

import re
from typing import Annotated, Literal

import msgspec

from rlt.contract.fields import field_names, validate
from rlt.models.model_config import DTYPE_BYTES, ModelConfig, dtype_name

# ---- engine and launch options -------------------------------------------------------------------
# Each option is a typed field with its default and help in one place: Engine.launch(**options)
# validates against these fields, the handshake carries the Structs, and the CLI builds its flags
# from them. Meta(ge=...) / Literal / `| None` are what validate() checks.
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
Count = Annotated[int, msgspec.Meta(ge=0)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
CPU_KV_BYTES = 1 << 30  # the CPU's default KV pool per worker


def _doc(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class EngineConfig(msgspec.Struct, kw_only=True, frozen=True):
    """What every worker's engine runs with (the scheduler, KV pool and kernels)."""

    kv_layout: Annotated[
        Literal["last_exited", "shared"],
        _doc(
            "last_exited: one KV plane per loop depth (exact); shared: one plane overwritten by every loop"
        ),
    ] = "last_exited"
    block_size: Annotated[PositiveInt, _doc("token positions per KV block")] = 16
    num_blocks: Annotated[
        PositiveInt | None, _doc("KV blocks per worker (default: sized from kv_memory_bytes)")
    ] = None
    kv_memory_bytes: Annotated[
        PositiveInt | None,
        _doc(
            "bytes of KV pool per worker when num_blocks is not given (default: on CUDA what "
            "gpu_memory_utilization leaves, on CPU 1 GiB)"
        ),
    ] = None
    gpu_memory_utilization: Annotated[
        Fraction,
        _doc(
            "CUDA: the share of the device's memory a worker takes in all (weights, activations, CUDA graphs, KV "
            "pool) when neither num_blocks nor kv_memory_bytes is given"
        ),
    ] = 0.9
    enable_prefix_caching: Annotated[
        bool,
        _doc(
            "reuse the KV blocks of a cached prefix whose tokens and loop depths match the request's"
        ),
    ] = True
    max_model_len: Annotated[
        PositiveInt | None,
        _doc(
            "the context a request may use, prompt and generated tokens, at most the model's max positions "
            "(default: the model's, config.json's max_position_embeddings)"
        ),
    ] = None
    max_num_seqs: Annotated[PositiveInt, _doc("requests running at once per worker")] = 64
    prefill_chunk: Annotated[
        PositiveInt,
        _doc(
            "prompt rows per request per pass (a lone prompt may take the whole pass, as in vLLM)"
        ),
    ] = 8192
    max_num_batched_tokens: Annotated[PositiveInt, _doc("rows per core pass")] = 8192
    decode_pass_rows: Annotated[
        PositiveInt,
        _doc(
            "rows per core pass while streams decode (their next tokens counted first; prompt chunks are cut to "
            "fit); while at most half of max_num_seqs streams decode, a pass's first prompt may take twice that, "
            "twice again each time they halve, at most max_num_batched_tokens: every pass a prompt chunk spends "
            "in the loop delays each decoding stream's next token (Sarathi-Serve's token budget, scaled by the "
            "streams it delays; docs/performance.md has the trade-off measured)"
        ),
    ] = 1536
    kernels: Annotated[
        Literal["triton", "reference"],
        _doc(
            "CUDA: the Triton kernels and CUDA graphs, or the plain torch reference (the CPU always runs it)"
        ),
    ] = "triton"
    batch_invariant: Annotated[
        bool,
        _doc(
            "CUDA: kernels whose per-row result does not depend on the batch (PD equal to single, bit for bit)"
        ),
    ] = False
    cuda_graph_max_batch: Annotated[
        Count,
        _doc(
            "CUDA: decode-only passes of up to this many rows replay CUDA graphs, as do passes carrying prompt "
            "chunks of up to max_num_batched_tokens (at most 2048) rows (0: no CUDA graphs)"
        ),
    ] = 256
    exit_wait_passes: Annotated[
        Count,
        _doc(
            "Huginn's exit criteria: passes a token that left the loop may wait, held on the device, for other "
            "rows to leave, so that their coda, head and sampling run together (0: each at once)"
        ),
    ] = 8
    steady_decode: Annotated[
        Literal["adaptive", "always", "never"],
        _doc(
            "decode-only stretches as device-side lanes: adaptive = while some request can exit early (the regular "
            "path is faster at fixed depth), always, or never"
        ),
    ] = "adaptive"
    speculative_loops: Annotated[
        Count,
        _doc(
            "looped self-speculation: decode tokens at a fixed depth are drafted by this many loops and verified "
            "by the rest in one pass, token for token as without it (0: off; a request may set its own)"
        ),
    ] = 0
    speculative_tokens: Annotated[
        int,
        msgspec.Meta(ge=1, le=16),
        _doc(
            "draft tokens a speculation round checks, in [1, 16]: it outputs those that agree and one more "
            "(a request may set its own; each round checks as many of them as pay at its recent acceptance)"
        ),
    ] = 6
    speculative_max_streams: Annotated[
        Count,
        _doc(
            "speculation rounds start only while at most this many requests decode (past it, a pass's more "
            "rows cost more than the drafts save)"
        ),
    ] = 64

    grammar_compile_timeout: Annotated[
        Seconds,
        _doc(
            "seconds a grammar may take to compile in a worker before its request fails (the compile's process "
            "is killed and its memory returned)"
        ),
    ] = 5.0
    grammar_compile_processes: Annotated[
        PositiveInt, _doc("processes per worker compiling grammars at once (more wait for one)")
    ] = 2
    max_grammar_bytes: Annotated[
        PositiveInt,
        _doc(
            "bytes of a request's grammar at most: its JSON schema, regex, grammar, choices or tools' schemas"
        ),
    ] = 256 << 10
    max_grammar_entries: Annotated[
        PositiveInt,
        _doc("enum and choice entries of a request's grammar at most, all of them together"),
    ] = 2048
    max_regex_length: Annotated[
        PositiveInt, _doc("characters of a request's regex, or of one JSON schema pattern, at most")
    ] = 4096

    def __post_init__(self) -> None:
        validate(self)


class Faults(msgspec.Struct, kw_only=True, frozen=True):
    """Testing only (Engine.launch(faults=...)): faults the workers inject, keyed by a prompt's first
    token id or a worker role; rlt/workers/faults.py applies them, nothing else reads them."""

    # the main loop hangs on such a request; the heartbeat goes on
    stall_first_token: int | None = None
    fail_transfer_first_token: int | None = None  # prefill: such a prompt's KV write fails
    lose_notif_first_token: int | None = None  # prefill: its KV lands, its notifications are lost
    hang_transfer_first_token: int | None = None  # prefill: its KV writes never report done
    slow_transfer_first_token: int | None = None  # prefill: its KV writes report done only after...
    slow_transfer_seconds: float = 5.0  # ... this long (a prefill held for a while, then finished)
    fingerprint_role: str | None = None  # workers of this role report a different fingerprint


class LaunchConfig(msgspec.Struct, kw_only=True, frozen=True):
    """How the coordinator runs the workers: topology, devices, supervision, PD routing."""

    topology: Annotated[
        str, _doc("single, Nx (N unified replicas, e.g. 2x) or XpYd (e.g. 1p1d)")
    ] = "single"
    device: Annotated[
        str, _doc("cpu, cuda or cuda:N (topologies of several workers take cuda:0, cuda:1, ...)")
    ] = "cpu"
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"] | None,
        _doc("weights and KV (default: float32 on CPU, the checkpoint's half type on GPU)"),
    ] = None
    startup_timeout: Annotated[Seconds, _doc("seconds a worker may take to load and warm up")] = (
        300.0
    )
    heartbeat_interval: Annotated[
        float,
        msgspec.Meta(ge=0.01),
        _doc("seconds between worker heartbeats (at least 0.01: a busier beat only burns CPU)"),
    ] = 0.5
    heartbeat_timeout: Annotated[
        Seconds,
        _doc(
            "seconds of silence, or of a stuck main loop with work, before a worker is killed and restarted"
        ),
    ] = 10.0
    restart: Annotated[bool, _doc("restart a worker that died")] = True
    restart_attempts: Annotated[
        PositiveInt,
        _doc("attempts to restart a dead worker, with exponential backoff from 0.5 s up to 30 s"),
    ] = 10
    max_queued_requests: Annotated[
        Count,
        _doc(
            "requests that may wait in the coordinator while every worker holds its share (2 x max_num_seqs); "
            "past it a request is refused at the call (EngineOverloadedError; HTTP 503 with Retry-After)"
        ),
    ] = 4096
    transfer_timeout: Annotated[
        Seconds, _doc("PD: seconds a KV transfer may take before its request fails")
    ] = 30.0
    max_local_prefill_length: Annotated[
        Count,
        _doc(
            "PD: prompts up to this many tokens are prefilled by the decode worker itself (0: off)"
        ),
    ] = 0
    max_prefill_queue_size: Annotated[
        Count | None,
        _doc(
            "PD: while a prefill worker holds this many requests, new ones are prefilled by the decode worker"
        ),
    ] = None
    prefill_worker_chunk: Annotated[
        PositiveInt | None,
        _doc(
            "PD: prefill workers take prompts in chunks of this many rows (default: prefill_chunk)"
        ),
    ] = None
    log_dir: Annotated[
        str | None,
        _doc(
            "where each launch keeps its workers' logs, a directory per launch (default: <cache dir>/logs; "
            "the 20 newest are kept)"
        ),
    ] = None
    faults: Annotated[Faults | None, _doc("testing only: faults the workers inject")] = None

    def __post_init__(self) -> None:
        validate(self)
        parse_topology(self.topology)
        if self.heartbeat_interval >= self.heartbeat_timeout:
            raise ValueError(
                f"heartbeat_interval {self.heartbeat_interval} must be < heartbeat_timeout "
                f"{self.heartbeat_timeout} (a worker would be declared dead between two heartbeats)"
            )
        if not (self.device in ("cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise ValueError(f"device {self.device!r} is not supported (cpu, cuda, cuda:N)")
        if not self.disaggregated:
            defaults = {f.name: f.default for f in msgspec.structs.fields(self)}
            for name in (
                "max_local_prefill_length",
                "max_prefill_queue_size",
                "prefill_worker_chunk",
            ):
                if getattr(self, name) != defaults[name]:
                    raise ValueError(
                        f"{name} applies to prefill/decode topologies (XpYd), not {self.topology!r}"
                    )

    def check_with(self, mc: ModelConfig, engine: EngineConfig) -> None:
        """What the options say together with the model (capped at max_model_len): a KV budget that
        holds no block, speculation at the model's whole depth."""
        if engine.speculative_loops >= mc.depth:
            raise ValueError(
                f"speculative_loops {engine.speculative_loops} must be below the model's depth {mc.depth}"
            )
        if engine.num_blocks is None and engine.kv_memory_bytes is not None:
            dtype = dtype_name(self.dtype, self.device, mc.torch_dtype)
            per_block = mc.kv.block_bytes(engine.block_size, DTYPE_BYTES[dtype])
            if engine.kv_memory_bytes < per_block:
                raise ValueError(
                    f"kv_memory_bytes {engine.kv_memory_bytes} holds no KV block: one block of "
                    f"{engine.block_size} positions of this model in {dtype} is {per_block} bytes"
                )

    @property
    def disaggregated(self) -> bool:
        return parse_topology(self.topology)[0][0] == "prefill"

    def engine_for(self, role: str, engine: EngineConfig) -> EngineConfig:
        """A prefill worker takes prompts in prefill_worker_chunk rows, in passes at least as large:
        no decode shares its passes."""
        chunk = self.prefill_worker_chunk
        if role != "prefill" or chunk is None:
            return engine
        return msgspec.structs.replace(
            engine,
            prefill_chunk=chunk,
            max_num_batched_tokens=max(chunk, engine.max_num_batched_tokens),
        )


def parse_topology(topology: str) -> list[tuple[str, int]]:
    """The worker slots: 'single' -> one unified worker; 'Nx' -> N unified replicas (requests go
    to the least loaded); 'XpYd' -> X prefill and Y decode workers."""
    if isinstance(topology, str):
        if topology == "single":
            return [("unified", 0)]
        if m := re.fullmatch(r"([1-9]\d*)x", topology):
            return [("unified", i) for i in range(int(m.group(1)))]
        if m := re.fullmatch(r"([1-9]\d*)p([1-9]\d*)d", topology):
            return [("prefill", i) for i in range(int(m.group(1)))] + [
                ("decode", i) for i in range(int(m.group(2)))
            ]
    raise ValueError(
        f"topology {topology!r} is not supported (single, Nx replicas such as 2x, or XpYd such as 1p1d)"
    )


def split_options(options: dict) -> tuple[EngineConfig, LaunchConfig]:
    """Engine.launch(**options): each option goes to the Struct that has a field of its name."""
    engine_fields, launch_fields = field_names(EngineConfig), field_names(LaunchConfig)
    for name in options:
        if name not in engine_fields and name not in launch_fields:
            raise ValueError(
                f"unknown option {name!r} (known: {', '.join(engine_fields + launch_fields)})"
            )
    return (
        EngineConfig(**{k: v for k, v in options.items() if k in engine_fields}),
        LaunchConfig(**{k: v for k, v in options.items() if k in launch_fields}),
    )
