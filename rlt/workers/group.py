"""A pass's row groups and what a step hands back: a Group is rows of one request moving through
the loop together (a prompt chunk, a decode token, or a position recomputed after preemption);
PendingTokens are a step's sampled tokens on their way to the host."""

from dataclasses import dataclass, field

import torch

from rlt.contract.sampling_params import ResolvedParams
from rlt.kernels.sampler import top_dict
from rlt.workers.kv_pool import BlockTables
from rlt.workers.prompt_logprobs import PromptLogprobs
from rlt.workers.step_buffers import DeviceReadback


@dataclass
class Group:
    """Rows of one request moving through the loop together (a prompt chunk or a decode token)."""

    ids: list[int]  # a decode group fed from the device holds [0] here
    start: int  # position of the first row
    tables: BlockTables
    params: ResolvedParams
    decoding: bool
    samples: bool  # ends the prompt, or is a decode token
    output_index: int  # index of the token this group samples
    depth: int = 0  # loops done
    inject: torch.Tensor | None = None
    state: torch.Tensor | None = None
    survival: torch.Tensor | None = None  # [1] prod(1 - hazard), decode groups
    # its criterion's value at its last check (exit_criteria.py)
    criterion_prev: "torch.Tensor | tuple | None" = None
    # A decode token sampled by the previous step and not read back yet: (its PendingTokens, index)
    feed: "tuple[PendingTokens, int] | None" = None
    # a generated position recomputed after preemption: runs to this depth
    exit_depth: int | None = None
    # left the loop by its criterion, held: passes it has waited (runner.py)
    parked: int | None = None
    # penalized: its request's slot of PenaltyState (rlt/workers/penalties.py)
    slot: int | None = None
    listed: int = 0  # ... and the distinct prompt tokens that open that slot's token list
    # prompt_logprobs asked: the prompt tokens its rows predict
    prompt_targets: list[int] | None = None
    # structured output: its request's Constraint (rlt/workers/grammar.py)
    matcher: object | None = None
    # Self-speculation (rlt/workers/speculation.py): the round this group drafts a token of, or
    # verifies
    draft_of: object | None = None
    verify_of: object | None = None

    @property
    def last_depth(self) -> int:
        """The depth it leaves the loop at (unless its request's exit rule ends it earlier)."""
        if self.exit_depth is not None:
            return self.exit_depth
        return self.draft_of.loops if self.draft_of is not None else self.params.max_loops

    @property
    def gated(self) -> bool:
        """Its exit may depend on the gate (a decode token of a request that can exit early by it)."""
        return (
            self.decoding
            and self.exit_depth is None
            and self.params.exit_criterion == "gate"
            and self.params.exits_early
        )

    @property
    def n(self) -> int:
        return len(self.ids)


@dataclass
class Sampled:
    group: Group
    token: int
    logprobs: dict[int, float] | None


class PendingTokens:
    """Tokens sampled by one step, still on their way to the host: the host can launch the next
    step (whose new decode rows read these tokens on the device) before it reads them."""

    def __init__(self, groups: list[Group], tokens: torch.Tensor, top: tuple | None):
        self.groups, self.tokens = groups, tokens  # tokens [S] int64 on the device
        self._readback = DeviceReadback((tokens,) + (top or ()))

    def resolve(self) -> list[Sampled]:
        tokens, *top = self._readback.resolve()
        return [
            Sampled(g, tok, top_dict(top, i, g.params.logprobs))
            for i, (g, tok) in enumerate(zip(self.groups, tokens))
        ]


@dataclass
class StepResult:
    exited: list[Group] = field(default_factory=list)
    sampled: PendingTokens | None = None
    prompt_logprobs: PromptLogprobs | None = None
