"""rlt outputs -> OpenAI's response pieces: logprobs (chat's `content` list, the completions'
tokens / token_logprobs / top_logprobs / text_offset), vLLM's `prompt_logprobs`, usage and ids.
(Request bodies -> SamplingParams: rlt/serve/requests.py.)"""

import time


def token_text(tokenizer, as_ids: bool):
    """A token id's text in logprobs: its own decode, or "token_id:N" (vLLM's
    return_tokens_as_token_ids; always without a tokenizer)."""
    if as_ids or tokenizer is None:
        return lambda i: f"token_id:{i}"
    return lambda i: tokenizer.decode([i])


def _top(pos: dict | None, k: int) -> list:
    return sorted(pos.items(), key=lambda x: -x[1])[:k] if pos else []


def logprobs(text, ids: list[int], positions: list, top: int, chat: bool, offset: int) -> dict:
    """Logprobs of these tokens (a position None: the prompt's first, which has none); `text`:
    token_text(...); completions' offsets count from `offset`."""
    if chat:
        entry = lambda t, lp: {"token": text(t), "logprob": lp, "bytes": list(text(t).encode())}  # noqa: E731
        return {
            "content": [
                entry(i, pos[i]) | {"top_logprobs": [entry(t, lp) for t, lp in _top(pos, top)]}
                for i, pos in zip(ids, positions)
            ]
        }
    tokens = [text(i) for i in ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [None if pos is None else pos[i] for i, pos in zip(ids, positions)],
        "top_logprobs": [
            None if p is None else {text(t): lp for t, lp in _top(p, top)} for p in positions
        ]
        if top
        else None,
        "text_offset": offsets,
    }


def prompt_logprobs(text, ids: list[int], positions: list | None, top: int) -> list | None:
    """vLLM's prompt_logprobs: per prompt position None (the first) or {token id: {logprob, rank,
    decoded_token}} for its top-K and the prompt token (rank: its place among the top-K, else None)."""
    if positions is None:
        return None
    out = []
    for i, pos in zip(ids, positions):
        if pos is None:
            out.append(None)
            continue
        ranked = [t for t, _ in _top(pos, top)]
        out.append(
            {
                str(t): {
                    "logprob": pos[t],
                    "rank": ranked.index(t) + 1 if t in ranked else None,
                    "decoded_token": text(t),
                }
                for t in dict.fromkeys([i, *ranked])
            }
        )
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},  # what the prefix cache held
    }


def created() -> int:
    return int(time.time())
