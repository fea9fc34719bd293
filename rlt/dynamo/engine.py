"""One rlt engine as a Dynamo LLM engine (Dynamo's unified Python backend contract).

Dynamo's frontend applies the checkpoint's chat template, tokenizes, detokenizes and checks stop
strings; the request that reaches generate() is token ids with sampling options and stop
conditions (Dynamo's PreprocessedRequest). They become rlt SamplingParams — checked by rlt
itself, so a bad field is refused before any worker sees it, naming the field and the limit (a 400
at the client); the frontend's guided decoding (response_format, guided_*, tool_choice required or
named) becomes a StructuredOutput; an option rlt cannot honour is refused, never dropped — and
the stream goes back as token-id deltas, each chunk with its tokens' exit depths in `engine_data`
(`exit_depths`; the last chunk also `request_exit_depths`, every token's), which a client gets
with `nvext.extra_fields: ["engine_data"]`. Loop options come as the request's
`nvext.annotations` ("exit_criterion=kl", "exit_threshold=0.5", "min_loops=2", "max_loops=3",
"speculative_loops=1":
Dynamo's frontend rejects unknown body fields). Cancellation closes the rlt stream, which aborts
the request.
For Dynamo's KV-aware router, load signal, health canary and /metrics: rlt/dynamo/router_state.py.
"""

import asyncio
import logging
from typing import Any

import msgspec
from dynamo.common.backend.engine import EngineConfig, LLMEngine, LlmRegistration
from dynamo.common.backend.health_check import is_probe
from dynamo.llm.exceptions import EngineShutdown, InvalidArgument

import rlt
from rlt.contract.sampling_params import SamplingParams, StructuredOutput
from rlt.control.stats import EngineStats
from rlt.dynamo.router_state import KvEvents, NodeWatch, RouterHooks
from rlt.errors import EngineDeadError, EngineOverloadedError, RequestError
from rlt.frontends.parsers import END_THINK, REASONING_PARSERS, Think

log = logging.getLogger("rlt.dynamo")

# rlt's finish reasons -> Dynamo's
FINISH = {"stop": "stop", "length": "length", "abort": "cancelled", "error": "error"}
LOOP_OPTIONS = (
    "exit_criterion",
    "exit_threshold",
    "min_loops",
    "max_loops",
    "speculative_loops",
    "speculative_tokens",
)


_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "n")
_SAMPLING += ("repetition_penalty", "presence_penalty", "frequency_penalty")
_GUIDED = ("json", "regex", "choice", "grammar")
# options a Dynamo request may carry that rlt cannot honour: refused, never dropped (-> the client's
# name for each; the frontend refuses most of them itself, other routers may not)
_REFUSED = {
    "best_of": "best_of",
    "use_beam_search": "use_beam_search",
    "length_penalty": "length_penalty",
    "allowed_token_ids": "allowed_token_ids",
    "bad_words_token_ids": "bad_words",
}


def sampling_params(request: dict) -> SamplingParams:
    """The request's SamplingParams (n choices: choice i seeded seed + i, as `rlt serve`). Stop
    strings stay with Dynamo's frontend (it detokenizes, finds them and ends the stream); a sampling
    option rlt cannot honour is a RequestError naming it."""
    so, sc = request.get("sampling_options") or {}, request.get("stop_conditions") or {}
    oo = request.get("output_options") or {}
    # (the frontend's passthrough)
    extra = (request.get("extra_args") or {}).get("sampling_options") or {}
    for k, name in _REFUSED.items():
        if so.get(k) not in (None, False) or extra.get(k) not in (None, False):
            raise RequestError(f"{name}: not supported by rlt")
    if sc.get("max_thinking_tokens") is not None:
        raise RequestError("max_thinking_tokens: not supported by rlt")
    kw: dict[str, Any] = {k: so[k] for k in _SAMPLING if so.get(k) is not None}
    if kw.get("top_k") == -1:
        kw["top_k"] = 0
    stop = {
        t
        for k in ("stop_token_ids_hidden", "stop_token_ids", "stop_token_ids_visible")
        for t in sc.get(k) or []
    }
    if stop:  # (which of them the text shows is the frontend's concern)
        kw["stop_token_ids"] = sorted(stop)
    for name in ("max_tokens", "min_tokens", "ignore_eos"):
        if sc.get(name) is not None:
            kw[name] = sc[name]
    if oo.get("logprobs") is not None:
        kw["logprobs"] = max(1, int(oo["logprobs"]))  # (rlt's also carry the sampled token's)
    if oo.get("prompt_logprobs") is not None:
        kw["prompt_logprobs"] = int(oo["prompt_logprobs"])
    if (guided := structured_output(so.get("guided_decoding"))) is not None:
        kw["structured_output"] = guided
    kw |= loop_options(request.get("annotations") or [])
    return SamplingParams(**kw)


def structured_output(g: dict | None) -> StructuredOutput | None:
    """Dynamo's guided_decoding (from response_format, guided_json/regex/choice/grammar or
    tool_choice required / named) -> rlt's StructuredOutput; what rlt's grammar engine (xgrammar)
    cannot do is refused: another backend, a whitespace pattern (rlt's JSON is always compact),
    SGLang's structural tags."""
    if not g:
        return None
    if g.get("backend") not in (None, "", "auto", "xgrammar"):
        raise RequestError(f"guided_decoding_backend: {g['backend']!r} is not rlt's (xgrammar)")
    if g.get("whitespace_pattern") is not None:
        raise RequestError(
            "guided_whitespace_pattern: not supported (rlt's JSON is always compact: no whitespace)"
        )
    if g.get("structural_tag") is not None:
        raise RequestError("structural_tag: not supported by rlt")
    given = {k: g[k] for k in _GUIDED if g.get(k) not in (None, [])}
    if not given:
        return None
    if len(given) > 1:  # (the frontend refuses this itself)
        raise RequestError(
            f"guided decoding: set one of json, regex, choice, grammar; got {sorted(given)}"
        )
    return StructuredOutput(**given)


def loop_options(annotations: list[str]) -> dict:
    """rlt's loop options from the request's `nvext.annotations` ("exit_threshold=0.5"): the one
    free-form field Dynamo's OpenAI frontend passes through to the engine. Each value as the Python
    API would get it (exit_criterion a string, the others a number: "2" an int, "0.5" a float, text
    that is neither left as it is); rlt's own validation then checks them as it checks any request,
    the threshold read per criterion (argmax-stability's counts checks): a 400 naming the field."""
    out = {}
    for a in annotations:
        name, eq, value = a.partition("=")
        if eq and name in LOOP_OPTIONS:
            out[name] = value if name == "exit_criterion" else _number(value)
    return out


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def prompt_logprobs(prompt: list[int], logprobs: list, top: int) -> list:
    """rlt's prompt logprobs as Dynamo's engine_data carries them: per position None (the first) or
    {"token id": {"logprob", "rank"}}, ranked among the top `top` (the prompt token past them
    unranked)."""
    positions = []
    for tok, pos in zip(prompt, logprobs):
        if pos is None:
            positions.append(None)
            continue
        ranked = sorted(pos.items(), key=lambda x: -x[1])
        positions.append(
            {
                str(t): {"logprob": lp} | ({"rank": r + 1} if r < top or t != tok else {})
                for r, (t, lp) in enumerate(ranked)
            }
        )
    return positions


class Sent:
    """What a choice has sent: its exit depths so far, its prompt logprobs (its first delta's)."""

    def __init__(self):
        self.depths, self.prompt_logprobs = [], None

    def add(self, out) -> None:
        self.depths += out.exit_depths
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs


def chunk(out, sent: Sent, top: int | None, prompt_top: int | None = None) -> dict:
    """A delta output (what is new for its choice; `sent` has taken it in) as a Dynamo response chunk."""
    c = {
        "index": out.index,
        "token_ids": out.token_ids,
        "engine_data": {"exit_depths": out.exit_depths},
    }
    if top is not None and out.logprobs is not None:
        positions = out.logprobs
        c["log_probs"] = [pos[t] for t, pos in zip(c["token_ids"], positions)]
        c["top_logprobs"] = [
            [
                {"rank": r + 1, "token_id": t, "logprob": lp}
                for r, (t, lp) in enumerate(sorted(pos.items(), key=lambda x: -x[1])[:top])
            ]
            for pos in positions
        ]
    if out.finished:  # (a non-streamed response keeps only the last chunk's engine_data)
        c["engine_data"]["request_exit_depths"] = sent.depths
        if prompt_top is not None and sent.prompt_logprobs is not None:
            c["engine_data"]["prompt_logprobs"] = prompt_logprobs(
                out.prompt_token_ids, sent.prompt_logprobs, prompt_top
            )
        c["finish_reason"] = FINISH.get(out.finish_reason, "error")
        prompt, done = len(out.prompt_token_ids), len(sent.depths)
        c["completion_usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "total_tokens": prompt + done,
        }
        if out.num_cached_tokens is not None:  # what the prefix cache held (OpenAI's usage field)
            c["completion_usage"]["prompt_tokens_details"] = {
                "cached_tokens": out.num_cached_tokens
            }
    return c


def exit_line(stats: EngineStats) -> str:
    """What the node leaves behind when it stops (nothing, unless requests were still running)."""
    local = [w for w in stats.workers if w.pid is not None]
    blocks = ", ".join(
        f"{w.role} worker {w.kv_blocks_free} of {w.kv_blocks_total} KV blocks free" for w in local
    )
    return f"rlt node at exit: {stats.live_requests} live requests, {stats.pending_cleanup} pending cleanup, {blocks}"


class RltEngine(RouterHooks, LLMEngine):
    """An rlt.Engine: its coordinator in this process, its worker as a subprocess. Aggregated: the
    `single` topology. Decode: 1p1d whose prefill slot is the prefill nodes found through Dynamo
    (rlt/dynamo/remote.py) — the decode worker reserves, a prefill node writes every depth plane
    into its blocks over NIXL and gives the first token, the decode worker continues."""

    def __init__(self, launch, served_name: str, prefill=None, reasoning_parser=None):
        """launch: rlt.Engine.launch(...) (options checked; a decode node's with its prefill slot,
        `prefill`: rlt/dynamo/remote.py DynamoPrefill); reasoning_parser: the one the node registers
        for Dynamo's frontend to run."""
        self.launch, self.served_name, self.reasoning_parser = launch, served_name, reasoning_parser
        self.engine_path = launch.engine.model_config.path  # the checkpoint directory, absolute
        self.engine: rlt.Engine | None = None
        self.prefill = prefill
        self.kv_events = KvEvents()  # the worker's prefix cache, to Dynamo's KV router
        launch.engine.watch_prefix_cache(self.kv_events)
        # (Dynamo's, once handed over)
        self.snapshots = self.endpoint = self.watch = self.metrics = None

    @classmethod
    def of(cls, node) -> "RltEngine":
        """The engine of an aggregated or decode node (rlt/dynamo/args.py Node)."""
        return cls(node.launch, node.served_name, node.prefill, node.reasoning_parser)

    @classmethod
    async def from_args(cls, argv=None):
        from rlt.dynamo.args import parse

        node = parse(argv)
        if node.role == "prefill":
            raise ValueError(
                "a prefill node is no Dynamo LLM engine: run it with python -m rlt.dynamo --role prefill"
            )
        return cls.of(node), node.config

    async def start(self, worker_id: int) -> EngineConfig:
        self.engine = await self.launch
        print(f"rlt node ready: worker logs in {self.engine.stats().log_dir}", flush=True)
        mc, cfg = self.engine.model_config, self.engine.engine_config
        w = next(w for w in self.engine.stats().workers if w.pid is not None)
        self.watch = NodeWatch(self)
        return EngineConfig(
            model=self.engine_path,
            served_model_name=self.served_name,
            llm=LlmRegistration(
                context_length=mc.max_positions,
                kv_cache_block_size=cfg.block_size,
                total_kv_blocks=w.kv_blocks_total // w.kv_planes,  # (blocks of every plane)
                max_num_seqs=cfg.max_num_seqs,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
            ),
        )

    async def generate(self, request: dict, context):
        try:
            if is_probe(request):  # the canary: a node that cannot serve fails it at once
                await self.engine.check_health()
            params = sampling_params(request)
            if params.structured_output is not None and self.reasoning_parser in REASONING_PARSERS:
                params = self.grammar_after_reasoning(request["token_ids"], params)
            stream = self.engine.generate(list(request["token_ids"]), params, output_kind="delta")
        except (RequestError, EngineDeadError, EngineOverloadedError) as e:
            if isinstance(e, RequestError):
                raise InvalidArgument(str(e)) from None
            log.warning("request %s refused: %s", context.id(), e)  # (the frontend's 503 hides it)
            raise EngineShutdown(str(e)) from None  # a 503: full (retry later) or no worker ready
        oo = request.get("output_options") or {}
        top, prompt_top = oo.get("logprobs"), oo.get("prompt_logprobs")
        sent: dict[int, Sent] = {}  # per choice
        try:
            async for out in stream:
                if out.finish_reason == "error":  # failed in a worker (e.g. its KV handoff): a 503
                    if not sent and (out.error or "").startswith("structured_output."):
                        # its grammar did not compile in the worker: a 400
                        raise InvalidArgument(out.error)
                    # (the 503 hides why)
                    log.warning("request %s failed: %s", context.id(), out.error)
                    raise EngineShutdown(out.error or "the request failed in an rlt worker")
                choice = sent.setdefault(out.index, Sent())
                choice.add(out)
                yield chunk(out, choice, top, prompt_top)
                if self.metrics is not None and not is_probe(request):
                    self.observe(out, len(choice.depths))
        except EngineDeadError as e:
            raise EngineShutdown(str(e)) from None
        finally:  # finished, failed or cancelled: the stream closes (unfinished choices abort)
            await stream.aclose()

    def grammar_after_reasoning(self, prompt: list[int], params: SamplingParams) -> SamplingParams:
        """Under a <think> reasoning parser, Dynamo's frontend takes the text before </think> as
        reasoning_content, so the grammar starts where the reasoning ends (as vLLM's with a reasoning
        parser) when the output begins inside the block: the prompt opens it (Nanbeige's template
        writes <think>), or the parser is deepseek_r1, which Dynamo runs as reasoning from the first
        token whatever the prompt."""
        tok = self.engine.tokenizer
        if tok is None:
            return params
        if (
            self.reasoning_parser != "deepseek_r1"
            and Think(tok.decode(prompt[-8:])).state != "reasoning"
        ):
            return params
        so = msgspec.structs.replace(
            params.structured_output, after=tok(END_THINK, add_special_tokens=False).input_ids
        )
        return msgspec.structs.replace(params, structured_output=so)

    async def cleanup(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
        if self.engine is not None:
            # what came in as the drain ended (the health canary: one token) ends first
            for _ in range(100):
                if self.engine.stats().live_requests == 0:
                    break
                await asyncio.sleep(0.02)
            print(exit_line(self.engine.stats()), flush=True)
            await self.engine.shutdown()
        if self.prefill is not None:
            self.prefill.shutdown()
