"""The model families, each described once: its names, how its config.json parses, which model code
runs it and which tensors it reads, and the random-weight checkpoint `rlt make-checkpoint` writes for
it (sizes, config.json, tokenizer).

FAMILIES (by config.json's model_type) is the one list of families, BY_NAME the same by short name.
No torch here: ModelConfig (which the coordinator imports) reads this table, so the model code,
which needs torch, is imported only when `model_cls` is first asked for.
"""

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rlt.models.configs import FamilyConfig, HuginnConfig, NanbeigeConfig, OuroConfig
from rlt.models.tokenizer import TokenizerSpec


@dataclass(frozen=True, eq=False)
class Family:
    name: str  # short name: ModelConfig.family, `rlt make-checkpoint --family`
    model_type: str  # config.json's model_type
    hf_names: tuple[str, ...]  # the released checkpoints on the Hugging Face Hub
    config_cls: type[FamilyConfig]  # parses and validates config.json
    model: str  # "module.Class" of the model code; the class has expected_tensors(mc)
    embed_name: str  # the token embedding (a tied lm_head must equal it)
    ignored_suffixes: tuple[str, ...]  # buffers a checkpoint may store that are recomputed
    # ---- `rlt make-checkpoint` -------------------------------------------------------------------
    tokenizer: TokenizerSpec
    presets: Mapping[str, Mapping[str, int]]  # --preset -> the size fields of config.json
    # (preset, special ids, dtype)
    config_json: Callable[[Mapping[str, int], dict[str, int], str], dict]
    # projection gain by tensor-name suffix
    init_gains: Mapping[str, float] = field(default_factory=dict)
    # the last weights of the loop's updates to its residual stream (regexes on tensor names):
    # scaled
    # by make-checkpoint's update_scale, so each loop changes the state little
    loop_outputs: tuple[str, ...] = (r"\.o_proj\.weight$", r"\.down_proj\.weight$")
    # projections whose first half of inputs is the loop's state (Huginn's adapter, state then
    # input): those columns are scaled too, so the recurrence contracts
    state_inputs: tuple[str, ...] = ()

    @property
    def model_cls(self) -> type:
        module, _, cls = self.model.rpartition(".")
        return getattr(importlib.import_module(module), cls)

    def expected_tensors(self, mc) -> dict[str, tuple[int, ...]]:
        """Every tensor name the model reads, with its shape from config.json."""
        return self.model_cls.expected_tensors(mc)


_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


# ---- Ouro ----------------------------------------------------------------------------------------
def _ouro_config_json(p: Mapping[str, int], ids: dict[str, int], dtype: str) -> dict:
    L = p["num_hidden_layers"]
    return {
        "architectures": ["OuroForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_ouro.OuroConfig",
            "AutoModel": "modeling_ouro.OuroModel",
            "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM",
        },
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "layer_types": ["full_attention"] * L,
        "max_position_embeddings": 65536,
        "max_window_layers": L,
        "model_type": "ouro",
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "total_ut_steps": 4,
        "early_exit_threshold": 1.0,
        "transformers_version": "4.55.0",
        "use_cache": True,
        "use_sliding_window": False,
        **p,
    }


OURO = Family(
    name="ouro",
    model_type="ouro",
    hf_names=("ByteDance/Ouro-1.4B", "ByteDance/Ouro-2.6B"),
    config_cls=OuroConfig,
    model="rlt.models.ouro.OuroModel",
    embed_name="model.embed_tokens.weight",
    ignored_suffixes=("rotary_emb.inv_freq",),
    tokenizer=TokenizerSpec(
        front_specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        back_specials=(),
        bos="<|endoftext|>",
        eos="<|endoftext|>",
        pad=None,
        prepend_bos=False,
        chat_template=(
            "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful "
            "assistant.<|im_end|>\\n' }}{% endif %}" + _CHATML
        ),
    ),
    presets={
        "tiny": dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        ),
        "full": dict(
            vocab_size=49152,
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            head_dim=128,
        ),
    },
    config_json=_ouro_config_json,
    # twice the unit gain on v/o: more context mixing, less repetition from random weights
    init_gains={"v_proj.weight": 2.0, "o_proj.weight": 2.0},
    # sandwich norms: the updates' scale is their weights', whatever the projections'
    loop_outputs=(r"input_layernorm_2\.weight$", r"post_attention_layernorm_2\.weight$"),
)


# ---- Nanbeige4.2 ---------------------------------------------------------------------------------
def _nanbeige_config_json(p: Mapping[str, int], ids: dict[str, int], dtype: str) -> dict:
    return {
        "architectures": ["NanbeigeForCausalLM"],
        "model_type": "nanbeige",
        "auto_map": {
            "AutoConfig": "configuration_nanbeige.NanbeigeConfig",
            "AutoModel": "modeling_nanbeige.NanbeigeModel",
            "AutoModelForCausalLM": "modeling_nanbeige.NanbeigeForCausalLM",
        },
        "kv_channels": p["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rope_theta": 70000000,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-5,
        "num_loops": 2,
        "loop_loss_weights": [],
        "skip_loop_final_norm": False,
        "pretraining_tp": 1,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "pad_token_id": ids["pad"],
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "torch_dtype": dtype,
        **p,
    }


NANBEIGE = Family(
    name="nanbeige",
    model_type="nanbeige",
    hf_names=("Nanbeige/Nanbeige4.2-3B",),
    config_cls=NanbeigeConfig,
    model="rlt.models.nanbeige.NanbeigeModel",
    embed_name="model.embed_tokens.weight",
    ignored_suffixes=("rotary_emb.inv_freq",),
    tokenizer=TokenizerSpec(
        front_specials=("<unk>",),
        back_specials=("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"),
        bos="<|im_start|>",
        eos="<|im_end|>",
        pad="<unk>",
        prepend_bos=True,
        chat_template=_CHATML.replace(
            "'<|im_start|>assistant\\n'", "'<|im_start|>assistant\\n<think>\\n'"
        ),
    ),
    presets={
        "tiny": dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
        ),
        "full": dict(
            vocab_size=166144,
            hidden_size=3072,
            intermediate_size=10752,
            num_hidden_layers=22,
            num_attention_heads=48,
            num_key_value_heads=8,
            head_dim=128,
        ),
    },
    config_json=_nanbeige_config_json,
)


# ---- Huginn-0125 ---------------------------------------------------------------------------------
def _huginn_config_json(p: Mapping[str, int], ids: dict[str, int], dtype: str) -> dict:
    H, heads = p["n_embd"], p["n_heads"]
    n_layers = p["n_layers_in_prelude"] + p["n_layers_in_recurrent_block"] + p["n_layers_in_coda"]
    depth = p["n_layers_in_prelude"] + p["n_layers_in_coda"] + p["n_layers_in_recurrent_block"] * 32
    std = math.sqrt(2 / (5 * H))
    return {
        "name": "nebel-raven-3.5b",
        "architectures": ["RavenForCausalLM"],
        "auto_map": {
            "AutoConfig": "raven_config_minimal.RavenConfig",
            "AutoModelForCausalLM": "raven_modeling_minimal.RavenForCausalLM",
        },
        "model_type": "huginn_raven",
        "block_size": 4096,
        "padded_vocab_size": p["vocab_size"],
        "padding_multiple": 4096,
        "tie_embeddings": True,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": H // heads,
        "bias": False,
        "architecture_class_name": "RecurrentGPT",
        "block_class_name": "SandwichBlock",
        "norm_class_name": "RMSNorm_llama",
        "norm_eps": 1e-6,
        "mlp_class_name": "GatedMLP",
        "nonlin_name": "SiLU",
        "init_strategy": "takase",
        "init_orthogonal": False,
        "state_init": "like-init",
        "injection_type": "linear",
        "n_layers": n_layers,
        "mean_recurrence": 32,
        "mean_backprop_depth": 8,
        "sampling_scheme": "poisson-lognormal-filling",
        "qk_bias": True,
        "activation_checkpoint_impl": "per-iteration",
        "rope_base": 50000,
        "effective_expected_depth": depth,
        "test_time_noise": 0,
        "test_time_noise_type": "fixed",
        "init_values": {
            "std": std,
            "out_proj": std / math.sqrt(2 * depth),
            "embedding": std,
            "embed_scale": math.sqrt(H),
        },
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "torch_dtype": dtype,
        "transformers_version": "4.44.2",
        **p,
    }


HUGINN = Family(
    name="huginn",
    model_type="huginn_raven",
    hf_names=("tomg-group-umd/huginn-0125",),
    config_cls=HuginnConfig,
    model="rlt.models.huginn.HuginnModel",
    embed_name="transformer.wte.weight",
    ignored_suffixes=("freqs_cis",),
    loop_outputs=(r"core_block\.\d+\.(attn|mlp)\.proj\.weight$",),
    state_inputs=(r"adapter\.weight$",),
    tokenizer=TokenizerSpec(
        front_specials=(),
        back_specials=(
            "<|begin_text|>",
            "<|end_text|>",
            "<|begin_header|>",
            "<|end_header|>",
            "<|end_turn|>",
            "<|pad|>",
        ),
        bos="<|begin_text|>",
        eos="<|end_text|>",
        pad="<|pad|>",
        prepend_bos=True,
        chat_template=(
            "{% for message in messages %}{% if loop.first %}{{ bos_token }}{% endif %}"
            "{{ '<|begin_header|>' + ('Huginn' if message['role'] == 'assistant' else message['role']) "
            "+ '<|end_header|>\\n\\n' + message['content'] | trim + '<|end_turn|>' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|begin_header|>Huginn<|end_header|>\\n\\n' }}"
            "{% else %}{{ '<|end_text|>' }}{% endif %}"
        ),
    ),
    presets={
        "tiny": dict(
            vocab_size=512,
            n_embd=64,
            n_heads=4,
            intermediate_size=128,
            n_layers_in_prelude=2,
            n_layers_in_recurrent_block=4,
            n_layers_in_coda=2,
        ),
        "full": dict(
            vocab_size=65536,
            n_embd=5280,
            n_heads=55,
            intermediate_size=17920,
            n_layers_in_prelude=2,
            n_layers_in_recurrent_block=4,
            n_layers_in_coda=2,
        ),
    },
    config_json=_huginn_config_json,
)


FAMILIES = {f.model_type: f for f in (OURO, NANBEIGE, HUGINN)}
BY_NAME = {f.name: f for f in FAMILIES.values()}
