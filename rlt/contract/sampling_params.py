"""SamplingParams: what a request asks for (defaults follow vLLM: temperature 1.0, max_tokens 16), and
ResolvedParams: the same with every default filled in, as the coordinator validated it."""

from typing import Annotated

import msgspec


def _doc(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


# Huginn's exit criteria (rlt/workers/exit_criteria.py) and their "auto" thresholds, the authors'
# defaults; argmax-stability's is a count of checks. "gate" is Ouro's learned exit gate.
EXIT_CRITERIA = {
    "latent-diff": 0.03,
    "cosine": 1e-3,
    "kl": 1e-3,
    "minp-kl": 1e-5,
    "entropy-diff": 1e-3,
    "argmax-stability": 5,
}


class StructuredOutput(
    msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """Output constrained by a grammar (vLLM's StructuredOutputsParams); exactly one field set."""

    json: dict | str | None = None  # a JSON schema (a dict, or its JSON text)
    regex: str | None = None  # the whole output matches this regular expression
    choice: list[str] | None = None  # the output is one of these strings
    grammar: str | None = None  # an EBNF (GBNF) grammar with a `root` rule
    json_object: bool | None = None  # True: any JSON object
    # xgrammar's structural tag (a dict or its JSON text; vLLM's structural_tag): free text with
    # tags,
    # e.g. tool calls, constrained inside; its JSON schema contents are compact and strict
    structural_tag: dict | str | None = None
    # the grammar starts after these token ids first appear in the output (e.g. `</think>`'s: the
    # reasoning before them is free, as vLLM's reasoning parsers); None: from the first token
    after: list[int] | None = None


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Each field's help is its description (the CLI's flags are made from them)."""

    max_tokens: Annotated[int, _doc("tokens to generate at most")] = 16
    temperature: Annotated[float, _doc("sampling temperature; 0 = greedy")] = 1.0
    top_k: Annotated[int, _doc("sample among the k most likely tokens; -1 or 0 = off")] = -1
    top_p: Annotated[float, _doc("sample within this probability mass (nucleus); 1 = off")] = 1.0
    seed: Annotated[int | None, _doc("seed of the sampling noise (default: a random one)")] = None
    min_loops: Annotated[
        int | None, _doc("loops a token runs at least before it may exit (default: 1)")
    ] = None
    max_loops: Annotated[
        int | None, _doc("loops a token runs at most (default: the model's depth)")
    ] = None
    exit_criterion: Annotated[
        str | None,
        _doc(
            "when a token leaves the loop: gate (Ouro's learned gate; the default), or Huginn's latent-diff, "
            "cosine, kl, minp-kl, entropy-diff, argmax-stability"
        ),
    ] = None
    exit_threshold: Annotated[
        float | None,
        _doc(
            "gate: exit once the gate's cumulative exit probability reaches this, in [0, 1] (default: "
            "config.json's); Huginn's criteria: exit once the change is below this (argmax-stability: "
            "once the argmax held for this many checks; default: the criterion's auto threshold)"
        ),
    ] = None
    stop_token_ids: Annotated[
        list[int], _doc("token ids that end the output, besides the model's EOS")
    ] = []
    ignore_eos: Annotated[bool, _doc("go on past EOS")] = False
    logprobs: Annotated[
        int | None,
        _doc("top-K logprobs per output position, with the sampled token's (default: none)"),
    ] = None
    prompt_logprobs: Annotated[
        int | None,
        _doc(
            "top-K logprobs per prompt position, with the prompt token's; the first is None (default: none)"
        ),
    ] = None
    repetition_penalty: Annotated[
        float,
        _doc(
            "divide positive logits (multiply negative ones) of prompt and output tokens by this; 1 = off"
        ),
    ] = 1.0
    presence_penalty: Annotated[
        float, _doc("subtract this from the logit of each token already output; 0 = off")
    ] = 0.0
    frequency_penalty: Annotated[
        float, _doc("subtract this times its count in the output from each token's logit; 0 = off")
    ] = 0.0
    min_p: Annotated[
        float, _doc("drop tokens less likely than min_p times the most likely one; 0 = off")
    ] = 0.0
    logit_bias: Annotated[
        dict[int, float], _doc("token id -> a bias added to its logit, in [-100, 100]")
    ] = {}
    min_tokens: Annotated[
        int, _doc("tokens to generate before EOS, stop_token_ids or stop may end the output")
    ] = 0
    stop: Annotated[
        list[str], _doc("strings that end the output (the text stops before them)")
    ] = []
    include_stop_str_in_output: Annotated[
        bool, _doc("keep the stop string that ended the output in its text")
    ] = False
    skip_special_tokens: Annotated[bool, _doc("leave special tokens out of the text")] = True
    n: Annotated[int, _doc("outputs of the prompt, choice i sampled with seed + i")] = 1
    structured_output: Annotated[
        StructuredOutput | None,
        _doc("constrain the output to a JSON schema, regex, choice or grammar"),
    ] = None
    speculative_loops: Annotated[
        int | None,
        _doc(
            "self-speculation: loops that draft each token (0 = off; default: the engine's speculative_loops); "
            "needs a fixed depth"
        ),
    ] = None
    speculative_tokens: Annotated[
        int | None,
        _doc(
            "self-speculation: draft tokens a round checks (default: the engine's speculative_tokens)"
        ),
    ] = None


class ResolvedParams(msgspec.Struct, frozen=True, kw_only=True):
    """SamplingParams with every default filled in; what a worker runs (and what travels to it)."""

    max_tokens: int
    temperature: float
    top_k: int  # 0 = off
    top_p: float
    sampling_seed: int  # a random one when the request gave none
    # Huginn's initial latent: the request's seed, else 0 (deterministic by default)
    state_seed: int
    min_loops: int
    max_loops: int
    # gate: >= 1.0 means fixed depth (max_loops); gate-less families never exit early
    exit_threshold: float
    # "gate" (Ouro's gate by exit_threshold; gate-less families: fixed depth), or one of
    # EXIT_CRITERIA
    # (Huginn, with exit_threshold read per criterion)
    exit_criterion: str = "gate"
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    logprobs: int  # 0 = none
    prompt_logprobs: int | None = None  # None = none; 0 = the prompt token's own only
    # logits processing (as vLLM's sampler, before temperature): 1.0 / 0.0 / {} / 0 = off
    repetition_penalty: float = 1.0  # prompt and output tokens
    presence_penalty: float = 0.0  # output tokens
    frequency_penalty: float = 0.0  # output tokens, times their count
    min_p: float = 0.0  # after temperature
    logit_bias: dict[int, float] = {}
    min_tokens: int = 0  # EOS and stop_token_ids are masked before this many outputs
    # (kind, spec text): rlt/contract/grammar.py spec_of
    structured_output: tuple[str, str] | None = None
    # StructuredOutput.after (empty: the grammar starts at once)
    grammar_after: tuple[int, ...] = ()
    speculative_loops: int | None = None  # None: the engine's (rlt/workers/speculation.py)
    speculative_tokens: int | None = None

    @property
    def exits_early(self) -> bool:
        """Can a decode token leave the loop before max_loops (by the gate or a criterion)?"""
        if self.min_loops >= self.max_loops:
            return False
        return self.exit_criterion in EXIT_CRITERIA or (
            self.exit_criterion == "gate" and self.exit_threshold < 1.0
        )

    @property
    def penalized(self) -> bool:
        """Does a token's logit depend on the request's prompt and output so far?"""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )
