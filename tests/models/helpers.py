"""What the model tests share: a greedy generation's tokens, depths and logprobs, and its check
against the dense reference's."""


class Generated:
    def __init__(self, outs):
        self.token_ids = [o.token_id for o in outs]
        self.exit_depths = [o.exit_depth for o in outs]
        self.logprobs = [o.logprobs for o in outs]


def assert_matches(g, tokens, depths, logps):
    assert g.token_ids == tokens
    assert g.exit_depths == depths
    for pos, lp in zip(g.logprobs, logps):
        for tok, val in pos.items():
            assert abs(val - lp[tok].item()) < 1e-4, (tok, val, lp[tok].item())
