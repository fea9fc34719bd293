"""Safetensors loading with strict name and shape checks against the family's official names."""

import json
import os

import torch
from safetensors import safe_open

from rlt.errors import CheckpointError
from rlt.models.family import FAMILIES
from rlt.models.model_config import ModelConfig, dtype_name

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str | None, device: str, mc: ModelConfig) -> torch.dtype:
    """rlt.models.model_config.dtype_name's choice as a torch dtype."""
    name = dtype_name(name, device, mc.torch_dtype)
    if name not in DTYPES:
        raise CheckpointError(f"dtype {name!r} is not supported (supported: {', '.join(DTYPES)})")
    return DTYPES[name]


def checkpoint_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no 'weight_map'")
        files = sorted(set(weight_map.values()))
        for name in files:
            if not os.path.isfile(os.path.join(path, name)):
                raise CheckpointError(f"{index} names shard {name!r}, which is missing")
        return [os.path.join(path, n) for n in files]
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    if any(n.endswith(".bin") or n.endswith(".pt") for n in os.listdir(path)):
        raise CheckpointError(
            f"{path} holds a PyTorch .bin checkpoint; only safetensors are supported "
            "(convert it with safetensors.torch.save_file)"
        )
    raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")


def load_weights(
    mc: ModelConfig, dtype: torch.dtype, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    family = FAMILIES[mc.model_type]
    expected = family.expected_tensors(mc)
    optional = {"lm_head.weight"} if mc.family_config.tie_word_embeddings else set()
    weights: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(mc.path):
        try:
            _read_file(file, family, mc, expected, weights)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors' own errors: a truncated or corrupt file
            raise CheckpointError(
                f"{file} cannot be read as safetensors: {type(e).__name__}: {e}"
            ) from None
    missing = [n for n in expected if n not in weights and n not in optional]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more} in {mc.path}")
    if "lm_head.weight" in weights and mc.family_config.tie_word_embeddings:
        if not torch.equal(weights["lm_head.weight"], weights[family.embed_name]):
            raise CheckpointError(
                f"tensor 'lm_head.weight' differs from the tied embedding {family.embed_name!r}"
            )
        del weights["lm_head.weight"]
    return {n: t.to(device=device, dtype=dtype) for n, t in weights.items()}


def load_model(mc: ModelConfig, dtype: torch.dtype, device: str = "cpu"):
    return FAMILIES[mc.model_type].model_cls(mc, load_weights(mc, dtype, device))


def _read_file(file: str, family, mc: ModelConfig, expected: dict, weights: dict) -> None:
    with safe_open(file, framework="pt", device="cpu") as f:
        for name in f.keys():
            if name.endswith(family.ignored_suffixes):
                continue
            if name not in expected:
                raise CheckpointError(
                    f"unexpected tensor {name!r} in {os.path.basename(file)} (not a {mc.model_type} parameter)"
                )
            if name in weights:
                raise CheckpointError(f"tensor {name!r} is stored twice")
            t = f.get_tensor(name)
            if tuple(t.shape) != expected[name]:
                raise CheckpointError(
                    f"tensor {name!r} has shape {tuple(t.shape)}, expected {expected[name]} from config.json"
                )
            if not t.is_floating_point():
                raise CheckpointError(f"tensor {name!r} has dtype {t.dtype}, expected a float type")
            weights[name] = t
