"""`rlt make-checkpoint`: random-weight checkpoints in the official schemas and tensor names.

Weights are scaled so outputs are not degenerate: projections keep unit variance, norm weights
sit near 1, the LM head gives logits with a spread of a few nats, and Ouro's exit gate gives
hazards that vary between tokens (so adaptive exit exercises every depth).
"""

import json
import math
import os
import re

import torch
from safetensors.torch import save_file

from rlt.models.family import BY_NAME, FAMILIES
from rlt.models.loader import DTYPES
from rlt.models.model_config import ModelConfig
from rlt.models.tokenizer import train_tokenizer


def official_config(family: str, preset: str, ids: dict[str, int], dtype: str) -> dict:
    """The config.json of a `family` checkpoint (by short name) at a preset's sizes."""
    f = BY_NAME[family]
    return f.config_json(f.presets[preset], ids, dtype)


def random_weights(
    mc: ModelConfig, seed: int, device: str = "cpu", update_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """update_scale: the last weights of the loop's updates to its residual stream (Family.loop_outputs:
    output projections, or Ouro's sandwich norms) and every norm's deviation from 1 times this:
    below 1 each loop changes the state less, so a token's first loops predict what its last ones
    do more often (self-speculation's acceptance)."""
    g = torch.Generator(device=device).manual_seed(seed)
    randn = lambda shape, generator: torch.randn(shape, generator=generator, device=device)  # noqa: E731
    family = FAMILIES[mc.model_type]
    from tqdm import tqdm

    out = {}
    tensors = family.expected_tensors(mc).items()
    for name, shape in tqdm(
        tensors, desc="rlt: drawing weights", unit="tensor", leave=False, disable=None
    ):
        if (
            name.endswith(("norm.weight", "layernorm.weight", "layernorm_2.weight", "ln_f.weight"))
            or ".norm_" in name
        ):
            t = 1.0 + 0.1 * update_scale * randn(shape, g)
        elif name == "model.early_exit_gate.weight":
            t = randn(shape, g) * (2.0 / math.sqrt(shape[1]))  # gate logit std ~2
        elif name == "model.early_exit_gate.bias":
            t = torch.full(shape, -1.0, device=device)
        elif name.endswith("qk_bias"):
            t = 0.1 * randn(shape, g)
        elif name == "transformer.wte.weight":  # also the tied head: logit std ~3
            t = randn(shape, g) * (3.0 / math.sqrt(shape[1]))
        elif name == "model.embed_tokens.weight":
            t = randn(shape, g)
        elif name == "lm_head.weight":
            t = randn(shape, g) * (3.0 / math.sqrt(shape[1]))  # logit std ~3
        else:  # projections: unit gain unless the family sets another (Family.init_gains)
            gain = next(
                (v for suffix, v in family.init_gains.items() if name.endswith(suffix)), 1.0
            )
            t = randn(shape, g) * (gain / math.sqrt(shape[-1]))
        if any(re.search(pattern, name) for pattern in family.loop_outputs):
            t = t * update_scale
        if any(re.search(pattern, name) for pattern in family.state_inputs):
            t[:, : shape[1] // 2] *= update_scale
        out[name] = t
    if mc.family_config.tie_word_embeddings and "lm_head.weight" in out:
        # stored, equal to the tied embedding (as Huginn's)
        out["lm_head.weight"] = out[family.embed_name]
    return out


def save_safetensors(weights: dict[str, torch.Tensor], out_dir: str, num_shards: int = 1) -> None:
    weights = {n: t.contiguous().cpu() for n, t in weights.items()}
    if num_shards <= 1:
        save_file(
            {n: t.clone() for n, t in weights.items()},
            os.path.join(out_dir, "model.safetensors"),
            metadata={"format": "pt"},
        )
        return
    names = list(weights)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    acc = 0
    for n in names:
        shards[min(num_shards - 1, acc * num_shards // max(total, 1))].append(n)
        acc += weights[n].numel() * weights[n].element_size()
    shards = [s for s in shards if s]
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(
            {n: weights[n].clone() for n in shard},
            os.path.join(out_dir, fname),
            metadata={"format": "pt"},
        )
        weight_map.update({n: fname for n in shard})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def make_checkpoint(
    family: str,
    out_dir: str,
    preset: str = "tiny",
    seed: int = 0,
    dtype: str | None = None,
    num_shards: int | None = None,
    device: str = "cpu",
    update_scale: float = 1.0,
) -> str:
    """device: where the random weights are drawn (cuda is much faster for --preset full; the
    values differ from a CPU draw with the same seed); update_scale: random_weights'."""
    if family not in BY_NAME:
        raise ValueError(f"family must be one of {', '.join(BY_NAME)}, got {family!r}")
    f = BY_NAME[family]
    if preset not in f.presets:
        raise ValueError(f"preset must be one of {', '.join(map(repr, f.presets))}, got {preset!r}")
    dtype = dtype or ("float32" if preset == "tiny" else "bfloat16")
    os.makedirs(out_dir, exist_ok=True)
    ids = train_tokenizer(f.tokenizer, f.presets[preset]["vocab_size"], out_dir)
    cfg = f.config_json(f.presets[preset], ids, dtype)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    mc = ModelConfig.from_pretrained(out_dir)
    weights = {
        n: t.to(DTYPES[dtype]) for n, t in random_weights(mc, seed, device, update_scale).items()
    }
    if num_shards is None:
        num_shards = max(
            1, math.ceil(sum(t.numel() * t.element_size() for t in weights.values()) / 4e9)
        )
    save_safetensors(weights, out_dir, num_shards)
    return out_dir
