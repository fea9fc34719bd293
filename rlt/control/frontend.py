"""rlt.Engine: the coordinator's front end, running in the caller's event loop.

It owns the ModelConfig, validates every request before any worker sees it, queues it for a worker
(rlt/control/admission.py), the Lifecycle taking every phase change, and streams its outputs
from a per-request collector, detokenized incrementally. Worker processes, transport and liveness
are the Supervisor's. It never blocks the event loop and imports no torch itself (xgrammar, which
does, loads with the tokenizer in a thread at launch; a grammar's check reads its structure only, well
under a millisecond, and the workers compile it).
"""

import asyncio
import importlib.util
import uuid
import weakref

import msgspec

from rlt.contract import grammar, validation
from rlt.contract.config import EngineConfig, LaunchConfig, split_options
from rlt.contract.sampling_params import SamplingParams
from rlt.control.admission import Admission
from rlt.control.cache_events import CacheListener, CacheRelay
from rlt.control.connector import PrefillConnector
from rlt.control.launch import Launch
from rlt.control.lifecycle import Phase, Request
from rlt.control.stats import EngineStats, engine_stats
from rlt.control.stream import OUTPUT_KINDS, RequestStream
from rlt.control.supervisor import Supervisor
from rlt.errors import EngineDeadError, RequestError
from rlt.models.model_config import ModelConfig


class Engine:
    def __init__(
        self,
        mc: ModelConfig,
        engine: EngineConfig,
        launch: LaunchConfig,
        *,
        remote_prefill: PrefillConnector = None,
    ):
        self.model_config, self.engine_config, self.launch_config = mc, engine, launch
        self.tokenizer = None  # the checkpoint's, once launch has loaded it (None: it ships none)
        self._tokenizer_loaded = False
        self._supervisor = Supervisor(mc, engine, launch, remote_prefill=remote_prefill)
        self._lifecycle = self._supervisor.lifecycle
        self._admission = Admission(self._supervisor, engine, launch)
        # calls with n > 1, by request id (their choices: "{id}-{i}")
        self._calls = weakref.WeakValueDictionary()
        # the last prompt tokenize() checked, and its checked copy
        self._last_prompt: tuple = (None, None)

    @classmethod
    def launch(
        cls,
        model: str | None = None,
        *,
        hf_overrides: dict | None = None,
        revision: str | None = None,
        remote_prefill: PrefillConnector | None = None,
        **options,
    ) -> Launch:
        """Build the ModelConfig and check every option (rlt.contract.config's EngineConfig and
        LaunchConfig fields) before any process is spawned; await the result, or use it with `async
        with`. model: a checkpoint directory, a Hugging Face Hub id (at `revision`), or None (the
        embedded default). remote_prefill: a PD topology's prefill slots served elsewhere
        (rlt/control/connector.py)."""
        engine, launch = split_options(options)
        if remote_prefill is not None and not launch.disaggregated:
            raise ValueError(f"remote_prefill: topology {launch.topology!r} has no prefill worker")
        if launch.disaggregated and importlib.util.find_spec("nixl") is None:
            raise ValueError(
                f"topology {launch.topology!r} moves KV between workers over NIXL, which is not "
                "installed: pip install 'rlt[pd]'"
            )
        if model is None:
            from rlt.models.default_model import default_model_path

            model = default_model_path()
        mc = ModelConfig.from_pretrained(model, hf_overrides=hf_overrides, revision=revision)
        # (its raw carries the cap to every worker)
        mc = mc.with_max_model_len(engine.max_model_len)
        launch.check_with(mc, engine)
        return Launch(cls(mc, engine, launch, remote_prefill=remote_prefill))

    async def shutdown(self) -> None:
        """Stop every worker, fail what is still live. Idempotent."""
        await self._supervisor.shutdown()
        self._lifecycle.fail_all(EngineDeadError("the engine was shut down"))

    def load_tokenizer(self, grammars: bool = True) -> None:
        """Load the checkpoint's tokenizer (idempotent; blocking: launch runs it in a thread, a
        command line may call it first to check its prompts before any process starts). grammars:
        False for a caller none of whose requests has a structured output (`rlt generate` without
        one): xgrammar's import (~1 s of CPU) is skipped; the first call decides."""
        if not self._tokenizer_loaded:
            from rlt.models.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(self.model_config.path)
            # structured output's checks: xgrammar (it imports torch)
            if self.tokenizer is not None and grammars:
                import xgrammar  # noqa: F401
            self._tokenizer_loaded = True

    # ---- requests --------------------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        """A prompt's token ids, checked against the vocabulary (RequestError); a text's with the
        tokenizer's special tokens (e.g. BOS) unless add_special_tokens is False."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError(
                    f"{self.model_config.path} has no tokenizer.json: give token ids, not text"
                )
            try:
                prompt = self.tokenizer(prompt, add_special_tokens=add_special_tokens).input_ids
            except Exception as e:  # e.g. a lone surrogate: not encodable text
                raise RequestError(
                    f"prompt text cannot be tokenized: {type(e).__name__}: {e}"
                ) from None
        # n choices of one prompt list: checked once (a compare is ~20x cheaper). One read of the
        else:
            last = self._last_prompt  # pair: a server's tokenizing thread may replace it meanwhile
            if prompt is last[0] and prompt == last[1]:
                return list(last[1])
        checked = validation.validate_prompt(self.model_config, prompt)
        self._last_prompt = (prompt, checked)
        return list(checked)

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        priority: int = 0,
        output_kind: str = "cumulative",
    ) -> RequestStream:
        """Async iterator of RequestOutputs, one choice's at a time (`index`; n > 1: choice i samples
        with seed + i, as a separate call with that seed would); each choice's last has
        finished=True. output_kind (vLLM's RequestOutputKind): "cumulative" (each output holds all so
        far), "delta" (what is new since the choice's last output) or "final_only" (its last alone).
        The call is validated (RequestError) and submitted at the call, its choices admitted together
        or not at all; cancelling the consuming task or closing the iterator aborts them."""
        p = params if params is not None else SamplingParams()
        n, stop = validation.output_options(p) if isinstance(p, SamplingParams) else (1, [])
        if stop and self.tokenizer is None:
            raise RequestError(
                f"stop strings need text: {self.model_config.path} has no tokenizer.json"
            )
        if output_kind not in OUTPUT_KINDS:
            raise RequestError(
                f"output_kind must be one of {', '.join(OUTPUT_KINDS)}, got {output_kind!r}"
            )
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif not isinstance(request_id, str) or not request_id:
            raise RequestError(f"request_id must be a non-empty string, got {request_id!r}")
        wake = asyncio.Event()
        requests = self._admit(prompt, p, request_id, priority, n, wake)
        stream = RequestStream(
            self._lifecycle, request_id, requests, self.tokenizer, p, stop, wake, output_kind
        )
        if n > 1:
            self._calls[request_id] = stream
        return stream

    def _admit(
        self, prompt, params: SamplingParams, request_id, priority, n, wake
    ) -> list[Request]:
        ids = self.tokenize(prompt)
        ps = [validation.resolve_params(self.model_config, len(ids), params)]
        # choice i: seed + i (one past int64 is refused by name), or its own random seed
        for i in range(1, n):
            seeded = (
                params
                if params.seed is None
                else msgspec.structs.replace(params, seed=params.seed + i)
            )
            ps.append(validation.resolve_params(self.model_config, len(ids), seeded))
        priority = validation.validate_priority(priority)
        # compiled (ms; then cached) before any worker sees it
        if (spec := ps[0].structured_output) is not None:
            if self.tokenizer is None:
                raise RequestError(
                    f"structured_output needs text: {self.model_config.path} has no tokenizer.json"
                )
            grammar.check(spec, self.engine_config)
        names = [request_id] if n == 1 else [f"{request_id}-{i}" for i in range(n)]
        lc = self._lifecycle
        for name in names:
            old = lc.live.get(name)
            # its stream was dropped (e.g. `break`): abort it now
            if old is not None and old.abandoned:
                lc.cancel(old)
        call = self._calls.get(request_id)
        if any(name in lc.live for name in names) or (call is not None and not call.finished):
            raise RequestError(f"request_id {request_id!r} is already live")
        self._admission.check_fits(len(ids), ps[0].max_tokens)
        return self._admission.queue(names, ids, ps, priority, wake)

    async def check_health(self) -> None:
        """Raises EngineDeadError (why) unless every role the topology needs has a worker that can
        serve (as vLLM's check_health): not while a needed worker is dead, restarting, not yet READY,
        silent for four heartbeats (stopped, say), stuck with work, or with its grammar compiles stuck."""
        for role in dict.fromkeys(role for role, _ in self._supervisor.local_slots):
            reasons = [self._supervisor.unhealthy(w) for w in self._admission.ready(role)]
            if all(reasons):
                raise EngineDeadError(f"no {role} worker can serve: {reasons[0]}")

    async def wait_failed(self) -> str:
        """Returns, with the reason, once the engine can no longer serve: a worker the topology needs
        died and will not be restarted (restart off, or its attempts ran out). A server exits on it."""
        await self._supervisor.gave_up.wait()
        return self._supervisor.dead_reason

    async def abort(self, request_id: str) -> bool:
        """End the call's choices with finish_reason 'abort'. Idempotent: False if not live."""
        call = self._calls.get(request_id)
        if call is not None and not call.finished:
            await call.aclose()
            return True
        r = self._lifecycle.live.get(request_id)
        if r is None:
            return False
        self._lifecycle.cancel(r)
        return True

    def request_phase(self, request_id: str) -> Phase | None:
        r = self._lifecycle.live.get(request_id)
        return r.phase if r is not None else None

    def stats(self) -> EngineStats:
        """Workers, requests, the prefix cache and the KV handoff, now (rlt/control/stats.py): typed
        structs; msgspec.to_builtins(stats) for JSON."""
        return engine_stats(self._supervisor, self._lifecycle)

    def watch_prefix_cache(self, listener: CacheListener) -> None:
        """Have the workers report their prefix caches to `listener`: the blocks a request with the
        default loop options would hit, stored and removed, with their tokens (for a KV-aware router
        outside rlt, such as NVIDIA Dynamo's: rlt/control/cache_events.py). Call it before the
        launch is awaited; a dead worker's blocks are reported removed."""
        if self._admission.loop is not None:
            raise RuntimeError("watch_prefix_cache: call it before the engine is launched")
        self._supervisor.cache_relay = CacheRelay(
            self.model_config, self.engine_config.block_size, listener
        )
