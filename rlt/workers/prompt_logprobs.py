"""prompt_logprobs (vLLM's): for each prompt position j >= 1, the log-softmax of the model's raw
logits at position j - 1 (the prompt runs at max_loops) of prompt token j, with the top-K; position
0 is None.

Computed in the pass where a prompt chunk leaves the loop, for every row of the chunk that predicts
a prompt token (Huginn's coda runs on every row anyway): projected max_num_seqs rows at a time, so
the logits never outgrow those of decode sampling (what the memory profile measured). Read back
with the step's tokens, kept in the Sequence (by position: a chunk recomputed after preemption adds
nothing) and sent with the request's first token. Such a request takes no prefix-cache hits before
its first token (its positions must run), as in vLLM.
"""

import numpy as np
import torch

from rlt.kernels.sampler import top_logprobs
from rlt.workers.step_buffers import DeviceReadback


def targets(prompt: list[int], start: int, n: int) -> list[int]:
    """The prompt tokens that rows start .. start + n - 1 predict (the last prompt row predicts none)."""
    return prompt[start + 1 : start + n + 1]


class PromptLogprobs:
    """One step's prompt logprobs on their way to the host."""

    @staticmethod
    def fields(exited: list, row_starts: list[int], boundary: bool) -> dict:
        """The asking groups' targets, and their rows among the exited rows (Huginn: after its coda)."""
        asking = [(g, r0) for g, r0 in zip(exited, row_starts) if g.prompt_targets]
        f = {"plp_target": np.concatenate([np.array(g.prompt_targets) for g, _ in asking])}
        if boundary:
            f["plp_row"] = np.concatenate(
                [r0 + np.arange(len(g.prompt_targets)) for g, r0 in asking]
            )
        return f

    def __init__(
        self, project, hidden: torch.Tensor, target: torch.Tensor, groups: list, piece: int
    ):
        """hidden [R, H]: the asking groups' rows, in order, ready for project() (-> logits)."""
        self.groups = groups
        k = max(g.params.prompt_logprobs for g in groups)
        values, ids = [], []
        for a in range(0, len(hidden), piece):
            v, i = top_logprobs(project(hidden[a : a + piece]), k, target[a : a + piece])
            values.append(v)
            ids.append(i)
        self._readback = DeviceReadback((torch.cat(values), torch.cat(ids)))

    def resolve_into(self, seqs: list) -> list:
        """Read back; each group's positions go to its Sequence's list ({id: logprob} of the top-K
        and the prompt token), those it has already skipped (recomputed after preemption). -> []:
        no step outputs (a drop-in for the engine's pending read-backs)."""
        values, ids = self._readback.resolve()
        r = 0
        for g, s in zip(self.groups, seqs):
            k = g.params.prompt_logprobs
            for j in range(g.start + 1, g.start + 1 + len(g.prompt_targets)):
                if j == len(s.prompt_logprobs):
                    s.prompt_logprobs.append(
                        dict(zip(ids[r][:k] + ids[r][-1:], values[r][:k] + values[r][-1:]))
                    )
                r += 1
        return []
