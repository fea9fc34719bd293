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
    /tmp/refvenv/bin/python scripts/huginn_reference.py --checkpoint /tmp/hg --seed 1 \
        --modeling <recurrent-pretraining>/recpre --out tests/huginn_reference.json
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
    assert (config.n_embd, config.n_heads, config.head_dim) == (cfg["n_embd"], cfg["n_heads"], cfg["head_dim"])
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
    calls between two `init`s) and the exit values its checks saw (for threshold margins)."""

    def __init__(self, model, inner):
        self.inner, self.depths, self.values = inner, [], []
        step = model.iterate_one_step

        def counted(*args, **kwargs):
            self.depths[-1] += 1
            return step(*args, **kwargs)

        model.iterate_one_step = counted

    def init(self, latents):
        self.depths.append(0)
        self.inner.init(latents)

    def check(self, model, latents, aux):
        exits, outputs, values = self.inner.check(model, latents, aux)
        self.values.append(float(values[0]))
        return exits, outputs, values


def run(mod, model, prompt, criterion, threshold, min_steps=0, num_steps=None):
    model.__dict__.pop("iterate_one_step", None)
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
        max_new_tokens=MAX_NEW_TOKENS,
        **kwargs,
    )
    tokens = out[0, len(prompt) :].tolist()
    assert len(tokens) == MAX_NEW_TOKENS == len(rec.depths)
    return tokens, rec.depths, rec.values


def margin(values, threshold, criterion) -> float:
    """Smallest relative distance of a checked value from the threshold (argmax-stability
    counts steps: no rounding question)."""
    if criterion == "argmax-stability" or not values:
        return math.inf
    t = float(threshold)
    return min(abs(v - t) / t for v in values if not math.isnan(v))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="an rlt tiny Huginn checkpoint")
    ap.add_argument("--seed", type=int, required=True, help="the seed the checkpoint was made with (recorded)")
    ap.add_argument("--modeling", required=True, help="folder with raven_modeling_minimal.py, raven_config_minimal.py")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--prompts", type=json.loads, default=PROMPTS, help="JSON list of token-id prompts (a held-out check: others)"
    )
    a = ap.parse_args()
    torch.manual_seed(0)
    mod = load_reference(a.modeling)
    overrides = {"mean_recurrence": DEPTH}
    model = build_model(mod, a.checkpoint, overrides)
    auto = {c: mod.get_adaptive_exit_evaluator(model, c, "auto").exit_threshold for c, _, _ in CASES}
    cases = []
    for prompt in a.prompts:
        for criterion, threshold, min_steps in CASES:
            tokens, depths, values = run(mod, model, prompt, criterion, threshold, min_steps)
            t = auto[criterion] if threshold == "auto" else threshold
            m = margin(values, t, criterion)
            assert m > 1e-3, f"{criterion} {threshold}: a value within {m:.1e} of the threshold"
            cases.append(
                dict(
                    prompt=prompt,
                    criterion=criterion,
                    threshold=threshold,
                    auto_threshold=auto[criterion],
                    min_steps=min_steps,
                    tokens=tokens,
                    depths=depths,
                    margin=None if math.isinf(m) else round(m, 4),
                )
            )
            print(criterion, threshold, min_steps, depths, tokens, f"margin {m:.3g}")
        for k in FIXED_DEPTHS:
            tokens, depths, _ = run(mod, model, prompt, "none", "auto", num_steps=k)
            assert depths == [k] * MAX_NEW_TOKENS
            cases.append(dict(prompt=prompt, criterion="none", num_steps=k, tokens=tokens, depths=depths))
            print("num_steps", k, tokens)
    fixture = dict(
        source="seal-rg/recurrent-pretraining recpre/raven_modeling_minimal.py generate_with_adaptive_compute",
        transformers=importlib.import_module("transformers").__version__,
        torch=torch.__version__,
        checkpoint=dict(family="huginn", preset="tiny", seed=a.seed),
        overrides=overrides | {"state_init": "zero"},
        settings=dict(
            init_scale=0.0, cache_lookup_strategy="latest-m4", do_not_exit_in_prefill=True, greedy=True, batch=1
        ),
        max_new_tokens=MAX_NEW_TOKENS,
        cases=cases,
    )
    with open(a.out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
