"""`rlt make-checkpoint`: random-weight checkpoints in the official schemas and tensor names.

Weights are scaled so outputs are not degenerate: projections keep unit variance, norm weights
sit near 1, the LM head gives logits with a spread of a few nats, and Ouro's exit gate gives
hazards that vary between tokens (so adaptive exit exercises every depth).
"""

import json
import math
import os

import torch
from safetensors.torch import save_file

from rlt.config import ModelConfig
from rlt.models.loader import DTYPES
from rlt.models.registry import FAMILIES
from rlt.models.tokenizer import train_tokenizer

MODEL_TYPES = {"ouro": "ouro", "nanbeige": "nanbeige", "huginn": "huginn_raven"}

PRESETS = {
    ("ouro", "tiny"): dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    ("ouro", "full"): dict(vocab_size=49152, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                           num_attention_heads=16, num_key_value_heads=16, head_dim=128),
    ("nanbeige", "tiny"): dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    ("nanbeige", "full"): dict(vocab_size=166144, hidden_size=3072, intermediate_size=10752,
                               num_hidden_layers=22, num_attention_heads=48, num_key_value_heads=8, head_dim=128),
    ("huginn", "tiny"): dict(vocab_size=512, n_embd=64, n_heads=4, intermediate_size=128,
                             n_layers_in_prelude=2, n_layers_in_recurrent_block=4, n_layers_in_coda=2),
    ("huginn", "full"): dict(vocab_size=65536, n_embd=5280, n_heads=55, intermediate_size=17920,
                             n_layers_in_prelude=2, n_layers_in_recurrent_block=4, n_layers_in_coda=2),
}


def official_config(family: str, preset: str, ids: dict[str, int], dtype: str) -> dict:
    p = PRESETS[(family, preset)]
    if family == "ouro":
        L = p["num_hidden_layers"]
        return {"architectures": ["OuroForCausalLM"], "attention_dropout": 0.0,
                "auto_map": {"AutoConfig": "configuration_ouro.OuroConfig",
                             "AutoModel": "modeling_ouro.OuroModel",
                             "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM"},
                "bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "hidden_act": "silu",
                "initializer_range": 0.02, "layer_types": ["full_attention"] * L,
                "max_position_embeddings": 65536, "max_window_layers": L, "model_type": "ouro",
                "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
                "tie_word_embeddings": False, "torch_dtype": dtype, "total_ut_steps": 4,
                "early_exit_threshold": 1.0, "transformers_version": "4.55.0", "use_cache": True,
                "use_sliding_window": False, **p}
    if family == "nanbeige":
        return {"architectures": ["NanbeigeForCausalLM"], "model_type": "nanbeige",
                "auto_map": {"AutoConfig": "configuration_nanbeige.NanbeigeConfig",
                             "AutoModel": "modeling_nanbeige.NanbeigeModel",
                             "AutoModelForCausalLM": "modeling_nanbeige.NanbeigeForCausalLM"},
                "kv_channels": p["head_dim"], "hidden_act": "silu", "max_position_embeddings": 262144,
                "rope_theta": 70000000, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
                "rms_norm_eps": 1e-5, "num_loops": 2, "loop_loss_weights": [], "skip_loop_final_norm": False,
                "pretraining_tp": 1, "tie_word_embeddings": False, "initializer_range": 0.02,
                "pad_token_id": ids["pad"], "bos_token_id": ids["bos"], "eos_token_id": ids["eos"],
                "torch_dtype": dtype, **p}
    H, heads = p["n_embd"], p["n_heads"]
    n_layers = p["n_layers_in_prelude"] + p["n_layers_in_recurrent_block"] + p["n_layers_in_coda"]
    depth = p["n_layers_in_prelude"] + p["n_layers_in_coda"] + p["n_layers_in_recurrent_block"] * 32
    std = math.sqrt(2 / (5 * H))
    return {"name": "nebel-raven-3.5b", "architectures": ["RavenForCausalLM"],
            "auto_map": {"AutoConfig": "raven_config_minimal.RavenConfig",
                         "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM"},
            "model_type": "huginn_raven", "block_size": 4096, "padded_vocab_size": p["vocab_size"],
            "padding_multiple": 4096, "tie_embeddings": True, "num_attention_heads": heads,
            "num_key_value_heads": heads, "head_dim": H // heads, "bias": False,
            "architecture_class_name": "RecurrentGPT", "block_class_name": "SandwichBlock",
            "norm_class_name": "RMSNorm_llama", "norm_eps": 1e-6, "mlp_class_name": "GatedMLP",
            "nonlin_name": "SiLU", "init_strategy": "takase", "init_orthogonal": False, "state_init": "like-init",
            "injection_type": "linear", "n_layers": n_layers, "mean_recurrence": 32, "mean_backprop_depth": 8,
            "sampling_scheme": "poisson-lognormal-filling", "qk_bias": True,
            "activation_checkpoint_impl": "per-iteration", "rope_base": 50000,
            "effective_expected_depth": depth, "test_time_noise": 0, "test_time_noise_type": "fixed",
            "init_values": {"std": std, "out_proj": std / math.sqrt(2 * depth), "embedding": std,
                            "embed_scale": math.sqrt(H)},
            "bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["pad"],
            "torch_dtype": dtype, "transformers_version": "4.44.2", **p}


def random_weights(mc: ModelConfig, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    randn = lambda shape, generator: torch.randn(shape, generator=generator, device=device)  # noqa: E731
    spec = FAMILIES[mc.model_type]
    out = {}
    for name, shape in spec.expected_tensors(mc).items():
        if name.endswith(("norm.weight", "layernorm.weight", "layernorm_2.weight", "ln_f.weight")) or ".norm_" in name:
            t = 1.0 + 0.1 * randn(shape, g)
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
        else:  # projections: unit gain (Ouro's v/o twice that: more context mixing, less repetition)
            gain = 2.0 if mc.model_type == "ouro" and name.endswith(("v_proj.weight", "o_proj.weight")) else 1.0
            t = randn(shape, g) * (gain / math.sqrt(shape[-1]))
        out[name] = t
    if mc.model_type == "huginn_raven":
        out["lm_head.weight"] = out["transformer.wte.weight"]  # stored, equal to the tied embedding
    return out


def save_safetensors(weights: dict[str, torch.Tensor], out_dir: str, num_shards: int = 1) -> None:
    weights = {n: t.contiguous().cpu() for n, t in weights.items()}
    if num_shards <= 1:
        save_file({n: t.clone() for n, t in weights.items()}, os.path.join(out_dir, "model.safetensors"),
                  metadata={"format": "pt"})
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
        save_file({n: weights[n].clone() for n in shard}, os.path.join(out_dir, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def make_checkpoint(family: str, out_dir: str, preset: str = "tiny", seed: int = 0,
                    dtype: str | None = None, num_shards: int | None = None, device: str = "cpu") -> str:
    """device: where the random weights are drawn (cuda is much faster for --preset full; the
    values differ from a CPU draw with the same seed)."""
    if family not in MODEL_TYPES:
        raise ValueError(f"family must be one of {', '.join(MODEL_TYPES)}, got {family!r}")
    if (family, preset) not in PRESETS:
        raise ValueError(f"preset must be 'tiny' or 'full', got {preset!r}")
    dtype = dtype or ("float32" if preset == "tiny" else "bfloat16")
    os.makedirs(out_dir, exist_ok=True)
    ids = train_tokenizer(family, min(PRESETS[(family, preset)]["vocab_size"], 1024), out_dir)
    cfg = official_config(family, preset, ids, dtype)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    mc = ModelConfig.from_pretrained(out_dir)
    weights = {n: t.to(DTYPES[dtype]) for n, t in random_weights(mc, seed, device).items()}
    if num_shards is None:
        num_shards = max(1, math.ceil(sum(t.numel() * t.element_size() for t in weights.values()) / 4e9))
    save_safetensors(weights, out_dir, num_shards)
    return out_dir
