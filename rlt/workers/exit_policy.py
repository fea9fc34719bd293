"""When a decode token leaves the loop, by the gate (exit_criterion "gate", the default).

Ouro: hazard lambda_t = sigmoid(g_t); CDF_t = 1 - prod_{i<=t}(1 - lambda_i); exit at the first
t >= min_loops with CDF_t >= threshold, else at max_loops. Threshold >= 1 means fixed depth
(max_loops), even where float rounding would make CDF_t reach 1.0. Families without a gate
have hazard 0: they always run max_loops. Prompts run at max_loops (the model's depth by
default), as the references run them at a given depth. Huginn's convergence criteria
(exit_criterion "latent-diff", "kl", ...) are rlt/workers/exit_criteria.py's.
"""

import torch


def update_survival(survival: torch.Tensor, gate_logit: torch.Tensor | None) -> torch.Tensor:
    """survival = prod(1 - lambda_i) so far, in float32; unchanged without a gate."""
    if gate_logit is None:
        return survival
    return survival * (1.0 - torch.sigmoid(gate_logit.float()))


def should_exit(
    depth: torch.Tensor,
    survival: torch.Tensor,
    min_loops: torch.Tensor,
    max_loops: torch.Tensor,
    threshold: torch.Tensor,
) -> torch.Tensor:
    """Per row: has the row that just finished loop `depth` (1-based) exited? All args [B]."""
    adaptive = (threshold < 1.0) & (depth >= min_loops) & ((1.0 - survival) >= threshold)
    return (depth >= max_loops) | adaptive
