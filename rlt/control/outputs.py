"""RequestOutput: what a request's stream yields, one choice at a time. token_ids, exit_depths,
logprobs and text are cumulative, or what is new since the choice's last output when the call asked
for output_kind "delta"; text grows only (a character still forming, or what may become a stop
string, is held back until it is settled)."""

import time
from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """When a choice reached each phase (time.monotonic() seconds; None: not yet): queued in the
    coordinator, admitted to a worker, its first token, finished."""

    arrival_time: float = field(default_factory=time.monotonic)
    scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    exit_depths: list[int] = field(default_factory=list)  # loop depth each output token exited at
    text: str = ""
    finished: bool = False  # this choice is done (a call with n > 1 ends when all are)
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    # per output position: top-K and the sampled token {id: logprob}
    logprobs: list[dict[int, float]] | None = None
    error: str | None = None
    # prompt positions whose KV the prefix cache held (set with the first token)
    num_cached_tokens: int | None = None
    index: int = 0  # which of the call's n choices
    # what ended it with finish_reason "stop": the stop string, or the stop token id (None: EOS)
    stop_reason: str | int | None = None
    # per prompt position: top-K and the prompt token {id: logprob}; the first is None
    # (prompt_logprobs)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    metrics: RequestMetrics = field(default_factory=RequestMetrics)

    def to_json(self) -> dict:
        d = {
            "request_id": self.request_id,
            "index": self.index,
            "prompt_token_ids": self.prompt_token_ids,
            "token_ids": self.token_ids,
            "exit_depths": self.exit_depths,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "text": self.text,
            "num_cached_tokens": self.num_cached_tokens,
        }
        if self.logprobs is not None:
            d["logprobs"] = [{str(t): lp for t, lp in pos.items()} for pos in self.logprobs]
        if self.prompt_logprobs is not None:
            d["prompt_logprobs"] = [
                None if pos is None else {str(t): lp for t, lp in pos.items()}
                for pos in self.prompt_logprobs
            ]
        if self.error is not None:
            d["error"] = self.error
        return d
