"""The sampler's dense reference of a row's logit edits (tests of the sampler and of the engine)."""

import torch


def reference_logits(raw: torch.Tensor, r: dict) -> torch.Tensor:
    """One row, written out densely: bias, min_tokens' ban, then the penalties with explicit counts."""
    x = raw.clone()
    for t, b in r["bias"].items():
        x[t] += b
    if r["index"] < r["min_tokens"]:
        for t in r["banned"]:
            x[t] = float("-inf")
    counts = torch.bincount(torch.tensor(r["output"], dtype=torch.int64), minlength=len(raw))
    seen = torch.zeros(len(raw), dtype=torch.bool)
    seen[r["prompt"]] = True
    seen |= counts > 0
    x = torch.where(seen, torch.where(x > 0, x / r["rep"], x * r["rep"]), x)
    x = x - r["freq"] * counts.float()
    return x - r["pres"] * (counts > 0).float()
