"""Safetensors loading: single and sharded, each dtype, and every kind of bad checkpoint."""

import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlt import CheckpointError, ModelConfig
from rlt.models.checkpoint import make_checkpoint
from rlt.models.loader import DTYPES, load_weights


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return make_checkpoint(
        "nanbeige", str(tmp_path_factory.mktemp("sh") / "n"), seed=1, num_shards=3
    )


def stored(path):
    out = {}
    for n in os.listdir(path):
        if n.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, n)))
    return out


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_single_file_round_trip(checkpoints, family, dtype):
    mc = ModelConfig.from_pretrained(checkpoints[family])
    w = load_weights(mc, DTYPES[dtype])
    ref = stored(checkpoints[family])
    if family == "huginn":  # the stored head is checked equal to wte, then dropped (tied)
        assert "lm_head.weight" in ref and "lm_head.weight" not in w
        ref.pop("lm_head.weight")
    assert set(w) == set(ref)
    for n, t in w.items():
        assert t.dtype == DTYPES[dtype]
        assert torch.equal(t, ref[n].to(DTYPES[dtype])), n


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_sharded_round_trip(sharded, checkpoints, dtype):
    assert os.path.isfile(os.path.join(sharded, "model.safetensors.index.json"))
    assert len([n for n in os.listdir(sharded) if n.endswith(".safetensors")]) == 3
    w = load_weights(ModelConfig.from_pretrained(sharded), DTYPES[dtype])
    w1 = load_weights(ModelConfig.from_pretrained(checkpoints["nanbeige"]), DTYPES[dtype])
    assert set(w) == set(w1) and all(torch.equal(w[n], w1[n]) for n in w)  # same seed, same weights


def broken_copy(src, tmp_path, edit):
    dst = tmp_path / "broken"
    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    edit(w)
    save_file(w, str(dst / "model.safetensors"))
    return ModelConfig.from_pretrained(str(dst))


def test_missing_tensor_is_named(checkpoints, tmp_path):
    mc = broken_copy(
        checkpoints["ouro"], tmp_path, lambda w: w.pop("model.layers.1.input_layernorm_2.weight")
    )
    with pytest.raises(
        CheckpointError, match=r"missing tensor 'model.layers.1.input_layernorm_2.weight'"
    ):
        load_weights(mc, torch.float32)


def test_extra_tensor_is_named(checkpoints, tmp_path):
    mc = broken_copy(
        checkpoints["ouro"],
        tmp_path,
        lambda w: w.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}),
    )
    with pytest.raises(
        CheckpointError, match=r"unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"
    ):
        load_weights(mc, torch.float32)


def test_misshaped_tensor_is_named(checkpoints, tmp_path):
    mc = broken_copy(
        checkpoints["nanbeige"],
        tmp_path,
        lambda w: w.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 64)}),
    )
    with pytest.raises(
        CheckpointError,
        match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 64\), "
        r"expected \(64, 64\)",
    ):
        load_weights(mc, torch.float32)


def test_huginn_stored_head_must_equal_embedding(checkpoints, tmp_path):
    mc = broken_copy(
        checkpoints["huginn"],
        tmp_path,
        lambda w: w.update({"lm_head.weight": w["lm_head.weight"] + 1e-3}),
    )
    with pytest.raises(CheckpointError, match="'lm_head.weight' differs from the tied embedding"):
        load_weights(mc, torch.float32)


def test_recomputed_buffers_are_ignored(checkpoints, tmp_path):
    mc = broken_copy(
        checkpoints["huginn"],
        tmp_path,
        lambda w: w.update({"freqs_cis": torch.zeros(1, 4096, 1, 8, 2)}),
    )
    assert "freqs_cis" not in load_weights(mc, torch.float32)


def test_integer_tensor_rejected(checkpoints, tmp_path):
    mc = broken_copy(
        checkpoints["ouro"],
        tmp_path,
        lambda w: w.update({"model.norm.weight": torch.ones(64, dtype=torch.int32)}),
    )
    with pytest.raises(CheckpointError, match="'model.norm.weight' has dtype"):
        load_weights(mc, torch.float32)


def test_bin_checkpoint_rejected(checkpoints, tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(os.path.join(checkpoints["ouro"], "config.json"), d)
    torch.save({}, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"\.bin checkpoint"):
        load_weights(ModelConfig.from_pretrained(str(d)), torch.float32)


def test_index_naming_a_missing_shard(sharded, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(sharded, d)
    os.remove(d / "model-00002-of-00003.safetensors")
    with pytest.raises(CheckpointError, match="model-00002-of-00003.safetensors"):
        load_weights(ModelConfig.from_pretrained(str(d)), torch.float32)


@pytest.mark.parametrize("family", ["ouro", "nanbeige", "huginn"])
def test_the_tokenizer_covers_every_id_of_the_preset(tmp_path, family):
    """make-checkpoint's tokenizer has exactly the config's vocabulary, at the official sizes too:
    every id a model can sample decodes to text (the corpus teaches ~700 merges; fillers cover the
    rest, before the family's trailing special tokens)."""
    from rlt.models.family import BY_NAME
    from rlt.models.tokenizer import load_tokenizer, train_tokenizer

    f = BY_NAME[family]
    for preset in ("tiny", "full"):
        vocab = f.presets[preset]["vocab_size"]
        out = tmp_path / preset
        out.mkdir()
        ids = train_tokenizer(f.tokenizer, vocab, str(out))
        tok = load_tokenizer(str(out))
        assert len(tok) == vocab and all(0 <= i < vocab for i in ids.values())
        specials = set(ids.values())
        assert all(
            tok.decode([i])
            for i in (vocab // 2, vocab - 1 - len(f.tokenizer.back_specials))
            if i not in specials
        )
        assert (
            tok.decode(tok("The river runs").input_ids, skip_special_tokens=True)
            == "The river runs"
        )
