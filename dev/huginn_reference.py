"""Reference outputs of Huginn's adaptive compute, from the authors' own code.

Runs `RavenForCausalLM.generate_with_adaptive_compute` of the authors' Hugging Face remote code
(seal-rg/recurrent-pretraining, recpre/raven_modeling_minimal.py and raven_config_minimal.py;
Apache-2.0, not vendored here: pass the folder that holds the two files) on an rlt tiny Huginn
checkpoint, and writes the tokens and per-token recurrence counts as a JSON fixture, so the CPU
tests compare rlt against the authors' code without transformers 4.57 installed.

Settings, as issue 33 fixes them: batch 1, greedy, float32, zero initial state (`init_scale=0`),
`cache_lookup_strategy="latest-m4"`, the prompt at full depth (`do_not_exit_in_prefill=True`).
Recorded: every criterion at "auto" and at a threshold under which exit depths vary on random
weights; some with `min_steps`; and fixed depth (`num_steps=k`, criterion "none").

    rlt make-checkpoint --family huginn --preset tiny --seed 1 --out /tmp/hg
    python -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 'transformers==4.57.*' safetensors
    /tmp/refvenv/bin/python dev/huginn_reference.py --checkpoint /tmp/hg --seed 1 \
        --modeling <recurrent-pretraining>/recpre --out tests/workers/huginn_reference.json

The held-out check (tests/workers/huginn_reference_heldout.json), made once rlt's criteria were
built and never used to build them: another seed's checkpoint, depth 10, other prompts, thresholds
and min_steps. Every checked value is more than 0.1 % from its threshold (--min-margin) and every
coda output's two largest logits more than 1e-3 apart (--min-gap), so float32 noise can flip
neither an exit nor a token; the script refuses a case that is closer (leave --out out to only
print each case's depths, margin and gap, e.g. while choosing thresholds):

    rlt make-checkpoint --family huginn --preset tiny --seed 2 --out /tmp/hg2
    /tmp/refvenv/bin/python dev/huginn_reference.py --checkpoint /tmp/hg2 --seed 2 \
        --modeling <recurrent-pretraining>/recpre --depth 10 --max-new-tokens 10 --min-gap 1e-3 \
        --prompts '[[7, 7, 123, 45, 301, 2, 99, 17, 64, 480, 33], [250, 12, 9, 400, 77],
                    [61, 3, 222, 18, 5, 390, 140, 8]]' \
        --cases '[["latent-diff", 0.9, 0], ["latent-diff", 0.75, 2], ["cosine", 0.45, 0], ["kl", 0.7, 0],
                  ["kl", 0.5, 3], ["minp-kl", 0.1, 0], ["entropy-diff", 0.1, 0], ["entropy-diff", 0.3, 2],
                  ["argmax-stability", 1, 0], ["argmax-stability", 3, 1]]' \
        --fixed-depths '[2, 4, 7]' --out tests/workers/huginn_reference_heldout.json
"""

import argparse
import importlib
import json
import math
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file

PROMPTS = [[11, 42, 7, 300, 19, 5, 88, 250, 3], [100, 200, 300, 400, 6, 7]]
MAX_NEW_TOKENS = 8
DEPTH = 8  # mean_recurrence: the tests run the same override (fast on CPU)
# (criterion, exit_threshold, min_steps): "auto" is the reference's default threshold; the
# numbers are chosen so that exit depths differ between tokens on the tiny random weights.
CASES = [
    ("latent-diff", "auto", 0),
    ("latent-diff", 0.4, 0),
    ("latent-diff", 0.4, 3),
    ("cosine", "auto", 0),
    ("cosine", 0.09, 0),
    ("kl", "auto", 0),
    ("kl", 0.3, 0),
    ("kl", 0.3, 2),
    ("minp-kl", "auto", 0),
    ("minp-kl", 0.2, 0),
    ("entropy-diff", "auto", 0),
    ("entropy-diff", 0.15, 0),
    ("argmax-stability", "auto", 0),
    ("argmax-stability", 2, 0),
    ("argmax-stability", 1, 1),
]
FIXED_DEPTHS = [1, 3, 5]


def load_reference(modeling_dir: str):
    """The authors' two files as a package (the modeling file imports its config relatively)."""
    pkg = tempfile.mkdtemp(prefix="raven_ref_")
    os.makedirs(os.path.join(pkg, "raven_ref"))
    for name in ("raven_modeling_minimal.py", "raven_config_minimal.py"):
        shutil.copy(os.path.join(modeling_dir, name), os.path.join(pkg, "raven_ref", name))
    open(os.path.join(pkg, "raven_ref", "__init__.py"), "w").close()
    sys.path.insert(0, pkg)
    return importlib.import_module("raven_ref.raven_modeling_minimal")


def build_model(mod, checkpoint: str, overrides: dict):
    with open(os.path.join(checkpoint, "config.json")) as f:
        cfg = json.load(f) | overrides
    config = mod.RavenConfig(**{k: v for k, v in cfg.items() if k != "auto_map"})
    assert (config.n_embd, config.n_heads, config.head_dim) == (
        cfg["n_embd"],
        cfg["n_heads"],
        cfg["head_dim"],
    )
    assert config.mean_recurrence == cfg["mean_recurrence"] and config.test_time_noise == 0
    model = mod.RavenForCausalLM(config).float().eval()
    weights = {}
    for name in sorted(os.listdir(checkpoint)):
        if name.endswith(".safetensors"):
            weights.update(load_file(os.path.join(checkpoint, name)))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert set(missing) <= {"freqs_cis"} and not unexpected, (missing, unexpected)
    return model


class Recorder:
    """Wraps an exit evaluator: the recurrences each generated position ran (iterate_one_step
    calls between two `init`s), the exit values its checks saw (for threshold margins) and the gap
    between the two largest logits of every coda output (an argmax that float32 noise could flip:
    the greedy token, argmax-stability's count)."""

    def __init__(self, model, inner):
        self.inner, self.depths, self.values, self.gaps = inner, [], [], []
        step, predict = model.iterate_one_step, model.predict_from_latents

        def counted(*args, **kwargs):
            self.depths[-1] += 1
            return step(*args, **kwargs)

        def predicted(*args, **kwargs):
            out = predict(*args, **kwargs)
            top = out.logits[0, -1].float().topk(2).values
            self.gaps.append(float(top[0] - top[1]))
            return out

        model.iterate_one_step, model.predict_from_latents = counted, predicted

    def init(self, latents):
        self.depths.append(0)
        self.inner.init(latents)

    def check(self, model, latents, aux):
        exits, outputs, values = self.inner.check(model, latents, aux)
        self.values.append(float(values[0]))
        return exits, outputs, values


def run(mod, model, prompt, criterion, threshold, max_new_tokens, min_steps=0, num_steps=None):
    for name in ("iterate_one_step", "predict_from_latents"):
        model.__dict__.pop(name, None)
    rec = Recorder(model, mod.get_adaptive_exit_evaluator(model, criterion, threshold))
    kwargs = {} if num_steps is None else {"num_steps": num_steps}
    gen = model.generation_config
    gen.do_sample, gen.eos_token_id, gen.pad_token_id, gen.bos_token_id = False, None, None, None
    out = model.generate_with_adaptive_compute(
        torch.tensor([prompt]),
        gen,
        exit_evaluator=rec,
        init_scale=0.0,
        cache_lookup_strategy="latest-m4",
        do_not_exit_in_prefill=True,
        min_steps=min_steps,
        max_new_tokens=max_new_tokens,
        **kwargs,
    )
    tokens = out[0, len(prompt) :].tolist()
    assert len(tokens) == max_new_tokens == len(rec.depths)
    return tokens, rec


def margin(values, threshold, criterion) -> float:
    """Smallest relative distance of a checked value from the threshold (argmax-stability
    counts steps: no rounding question)."""
    if criterion == "argmax-stability" or not values:
        return math.inf
    t = float(threshold)
    return min(abs(v - t) / t for v in values if not math.isnan(v))


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--checkpoint", required=True, help="an rlt tiny Huginn checkpoint")
    ap.add_argument(
        "--seed", type=int, required=True, help="the seed the checkpoint was made with (recorded)"
    )
    ap.add_argument(
        "--modeling",
        required=True,
        help="folder with raven_modeling_minimal.py, raven_config_minimal.py",
    )
    ap.add_argument(
        "--out", help="the fixture to write (left out: only report each case and its margins)"
    )
    ap.add_argument(
        "--prompts",
        type=json.loads,
        default=PROMPTS,
        help="JSON list of token-id prompts (a held-out check: others)",
    )
    ap.add_argument(
        "--cases",
        type=json.loads,
        default=CASES,
        help="JSON list of [criterion, exit_threshold, min_steps], e.g. '[[\"kl\", 0.25, 1]]' (default: CASES)",
    )
    ap.add_argument(
        "--fixed-depths", type=json.loads, default=FIXED_DEPTHS, help="JSON list of num_steps k"
    )
    ap.add_argument(
        "--depth", type=int, default=DEPTH, help="mean_recurrence (the tests run the same override)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    ap.add_argument(
        "--min-margin",
        type=float,
        default=1e-3,
        help="refuse a case whose checked value comes within this share of its threshold (float32 noise could "
        "flip its exit)",
    )
    ap.add_argument(
        "--min-gap",
        type=float,
        default=0.0,
        help="refuse a case with a coda output whose two largest logits are closer than this (float32 noise "
        "could flip its greedy token or argmax-stability's count)",
    )
    a = ap.parse_args()
    torch.manual_seed(0)
    mod = load_reference(a.modeling)
    overrides = {"mean_recurrence": a.depth}
    model = build_model(mod, a.checkpoint, overrides)
    auto = {
        c: mod.get_adaptive_exit_evaluator(model, c, "auto").exit_threshold for c, _, _ in a.cases
    }
    cases, refused = [], []
    for prompt in a.prompts:
        for criterion, threshold, min_steps in a.cases:
            tokens, rec = run(mod, model, prompt, criterion, threshold, a.max_new_tokens, min_steps)
            t = auto[criterion] if threshold == "auto" else threshold
            m, gap = margin(rec.values, t, criterion), min(rec.gaps)
            line = f"{criterion} {threshold} {min_steps} {rec.depths} {tokens} margin {m:.3g} gap {gap:.3g}"
            print(line)
            if m <= a.min_margin or gap <= a.min_gap:
                refused.append(f"{prompt} {line}")
            cases.append(
                dict(
                    prompt=prompt,
                    criterion=criterion,
                    threshold=threshold,
                    auto_threshold=auto[criterion],
                    min_steps=min_steps,
                    tokens=tokens,
                    depths=rec.depths,
                    margin=None if math.isinf(m) else round(m, 4),
                )
                | ({"gap": round(gap, 4)} if a.min_gap else {})
            )
        for k in a.fixed_depths:
            tokens, rec = run(mod, model, prompt, "none", "auto", a.max_new_tokens, num_steps=k)
            assert rec.depths == [k] * a.max_new_tokens
            gap = min(rec.gaps)
            print("num_steps", k, tokens, f"gap {gap:.3g}")
            if gap <= a.min_gap:
                refused.append(f"{prompt} num_steps {k} gap {gap:.3g}")
            cases.append(
                dict(prompt=prompt, criterion="none", num_steps=k, tokens=tokens, depths=rec.depths)
                | ({"gap": round(gap, 4)} if a.min_gap else {})
            )
    if refused:
        sys.exit("too close to flip-by-noise (--min-margin, --min-gap):\n" + "\n".join(refused))
    if a.out is None:
        return
    fixture = dict(
        source="seal-rg/recurrent-pretraining recpre/raven_modeling_minimal.py generate_with_adaptive_compute",
        transformers=importlib.import_module("transformers").__version__,
        torch=torch.__version__,
        checkpoint=dict(family="huginn", preset="tiny", seed=a.seed),
        overrides=overrides | {"state_init": "zero"},
        settings=dict(
            init_scale=0.0,
            cache_lookup_strategy="latest-m4",
            do_not_exit_in_prefill=True,
            greedy=True,
            batch=1,
        ),
        max_new_tokens=a.max_new_tokens,
        cases=cases,
    )
    with open(a.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
