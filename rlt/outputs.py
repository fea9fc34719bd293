"""RequestOutput: what a request's stream yields. token_ids and exit_depths are cumulative."""

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    exit_depths: list[int] = field(default_factory=list)  # loop depth each output token exited at
    text: str = ""
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    logprobs: list[dict[int, float]] | None = None  # per output position: top-K and the sampled token {id: logprob}
    error: str | None = None
    num_cached_tokens: int | None = None  # prompt positions whose KV the prefix cache held (set with the first token)

    def to_json(self) -> dict:
        d = {
            "request_id": self.request_id,
            "prompt_token_ids": self.prompt_token_ids,
            "token_ids": self.token_ids,
            "exit_depths": self.exit_depths,
            "finish_reason": self.finish_reason,
            "text": self.text,
            "num_cached_tokens": self.num_cached_tokens,
        }
        if self.logprobs is not None:
            d["logprobs"] = [{str(t): lp for t, lp in pos.items()} for pos in self.logprobs]
        if self.error is not None:
            d["error"] = self.error
        return d
