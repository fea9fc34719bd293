"""ModelConfig: official schemas accepted, derived facts, every rejection, hf_overrides."""

import json
import math

import pytest

from rlt import ConfigError, ModelConfig
from rlt.models.checkpoint import official_config

IDS = {"bos": 1, "eos": 2, "pad": 0}


def write(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def official(family):
    return official_config(family, "full", IDS, "bfloat16")


def test_official_shapes_derive_family_neutral_facts(tmp_path):
    o = ModelConfig.from_pretrained(write(tmp_path, official("ouro")))
    assert (o.family, o.depth, o.vocab_size, o.hidden_size, o.max_positions) == (
        "ouro",
        4,
        49152,
        2048,
        65536,
    )
    assert (o.kv.num_core_layers, o.kv.num_boundary_layers, o.kv.num_kv_heads, o.kv.head_dim) == (
        24,
        0,
        16,
        128,
    )
    assert o.has_exit_gate and o.default_exit_threshold == 1.0 and o.eos_token_ids == (2,)
    assert o.kv.bytes_per_token(4, 2) == 786432  # 768 KiB at 4 depths in bf16 (models.md)

    n = ModelConfig.from_pretrained(write(tmp_path, official("nanbeige")))
    assert (n.depth, n.vocab_size, n.max_positions, n.bos_token_id) == (2, 166144, 262144, 1)
    # head_dim != 3072/48
    assert (n.kv.num_core_layers, n.kv.num_kv_heads, n.kv.head_dim) == (22, 8, 128)
    assert n.kv.bytes_per_token(2, 2) == 176 * 1024
    assert not n.has_exit_gate

    h = ModelConfig.from_pretrained(write(tmp_path, official("huginn")))
    assert (h.family, h.depth, h.vocab_size, h.max_positions, h.hidden_size) == (
        "huginn",
        32,
        65536,
        4096,
        5280,
    )
    assert (h.kv.num_core_layers, h.kv.num_boundary_layers, h.kv.num_kv_heads, h.kv.head_dim) == (
        4,
        4,
        55,
        96,
    )
    assert h.family_config.embed_scale == pytest.approx(math.sqrt(5280))
    assert h.family_config.state_std == pytest.approx(0.008703882797784892)
    assert h.family_config.rope_theta == 50000 and h.family_config.qk_bias


def test_inactive_fields_are_accepted(tmp_path):
    cfg = official("huginn") | {"test_time_noise": 0, "test_time_noise_type": "fixed"}
    ModelConfig.from_pretrained(write(tmp_path, cfg))
    cfg = official("ouro") | {
        "sliding_window": 4096,
        "use_sliding_window": False,
        "rope_scaling": None,
    }
    ModelConfig.from_pretrained(write(tmp_path, cfg))
    cfg = official("nanbeige") | {
        "enable_mhc": False,
        "loop_share_kv": False,
        "loop_loss_weights": [],
    }
    ModelConfig.from_pretrained(write(tmp_path, cfg))
    # transformers-5 style rope dict with the default rope type carries theta
    cfg = {k: v for k, v in official("ouro").items() if k != "rope_theta"}
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 123.0}
    assert ModelConfig.from_pretrained(write(tmp_path, cfg)).family_config.rope_theta == 123.0


REJECTIONS = [
    ("ouro", {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ("ouro", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_parameters"),
    ("ouro", {"use_sliding_window": True}, "use_sliding_window"),
    ("ouro", {"layer_types": ["sliding_attention"] * 24}, "layer_types"),
    ("ouro", {"hidden_act": "gelu"}, "hidden_act"),
    ("ouro", {"early_exit_threshold": 1.5}, "early_exit_threshold"),
    ("ouro", {"total_ut_steps": 0}, "total_ut_steps"),
    ("ouro", {"num_hidden_layers": "24"}, "num_hidden_layers"),
    ("ouro", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("ouro", {"hidden_size": None}, "hidden_size"),
    ("ouro", {"model_type": "llama"}, "model_type"),
    ("nanbeige", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ("nanbeige", {"loop_loss_weights": [0.5]}, "loop_loss_weights"),
    ("nanbeige", {"num_loops": 0}, "num_loops"),
    ("huginn", {"test_time_noise": 0.1}, "test_time_noise"),
    ("huginn", {"state_init": "normal"}, "state_init"),
    ("huginn", {"injection_type": "add"}, "injection_type"),
    ("huginn", {"bias": True}, "bias"),
    ("huginn", {"tie_embeddings": False}, "tie_embeddings"),
    ("huginn", {"n_layers": 9}, "n_layers"),
    ("huginn", {"mean_recurrence": -1}, "mean_recurrence"),
    ("huginn", {"num_key_value_heads": 5}, "num_key_value_heads"),
]
NANBEIGE_FLAGS = [
    "enable_double_loop_split",
    "loop_share_kv",
    "enable_hyper_connection",
    "enable_mhc",
    "enable_depth_attention",
    "qk_layernorm",
    "attention_bias",
    "mlp_bias",
]


@pytest.mark.parametrize(
    "family,change,field",
    REJECTIONS
    + [("nanbeige", {f: True}, f) for f in NANBEIGE_FLAGS]
    + [("nanbeige", {"emb_neighbor_num": 2}, "emb_neighbor_num")],
)
def test_rejection_names_the_field(tmp_path, family, change, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        ModelConfig.from_pretrained(write(tmp_path, official(family) | change))


@pytest.mark.parametrize("family,change,field", REJECTIONS[:3])
def test_overrides_are_validated_too(tmp_path, family, change, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        ModelConfig.from_pretrained(write(tmp_path, official(family)), hf_overrides=change)


def test_hf_overrides_change_depth_and_state_init(tmp_path):
    p = write(tmp_path, official("ouro"))
    assert ModelConfig.from_pretrained(p, hf_overrides={"total_ut_steps": 2}).depth == 2
    p = write(tmp_path, official("huginn"))
    h = ModelConfig.from_pretrained(p, hf_overrides={"mean_recurrence": 8, "state_init": "zero"})
    assert h.depth == 8 and h.family_config.state_init == "zero"
    assert h.raw["mean_recurrence"] == 8  # what workers rebuild from
    p = write(tmp_path, official("nanbeige"))
    assert ModelConfig.from_pretrained(p, hf_overrides={"num_loops": 1}).depth == 1
    with pytest.raises(ConfigError, match="hf_overrides"):
        ModelConfig.from_pretrained(p, hf_overrides=[("num_loops", 1)])


def test_missing_config_and_generation_config_eos(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        ModelConfig.from_pretrained(str(tmp_path))
    cfg = official("huginn")
    del cfg["eos_token_id"]
    write(tmp_path, cfg)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [65505, 65508]}))
    assert ModelConfig.from_pretrained(str(tmp_path)).eos_token_ids == (65505, 65508)


def test_rebuilt_from_raw_is_identical(tmp_path):
    mc = ModelConfig.from_pretrained(
        write(tmp_path, official("nanbeige")), hf_overrides={"num_loops": 3}
    )
    assert ModelConfig.from_dict(mc.raw, mc.path) == mc


def test_absent_fields_take_the_reference_class_defaults(tmp_path):
    """Defaults as the official config classes set them when config.json omits a field."""
    cfg = official("nanbeige")
    for k in ("bos_token_id", "eos_token_id", "head_dim"):
        del cfg[k]
    n = ModelConfig.from_pretrained(write(tmp_path, cfg))
    assert (n.bos_token_id, n.eos_token_ids) == (1, (2,))  # NanbeigeConfig defaults
    assert n.kv.head_dim == 3072 // 48  # kv_channels (128) is never read by the reference code
    cfg = official("ouro")
    del cfg["num_key_value_heads"]
    cfg["num_attention_heads"] = 32
    # Qwen2Config default
    assert ModelConfig.from_pretrained(write(tmp_path, cfg)).kv.num_kv_heads == 32
    cfg["num_key_value_heads"] = None
    cfg["num_attention_heads"] = 16
    assert ModelConfig.from_pretrained(write(tmp_path, cfg)).kv.num_kv_heads == 16  # null: MHA
    with pytest.raises(ConfigError, match="'early_exit_step'"):
        ModelConfig.from_pretrained(write(tmp_path, official("ouro") | {"early_exit_step": 1}))


def test_generation_config_eos_ids_are_added(tmp_path):
    write(tmp_path, official("ouro"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert ModelConfig.from_pretrained(str(tmp_path)).eos_token_ids == (2, 7)
