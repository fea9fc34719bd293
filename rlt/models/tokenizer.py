"""Tokenizers: training the small real ones the checkpoint maker ships, and loading any checkpoint's.

Training uses the `tokenizers` library (byte-level BPE) on text the package ships. Loading goes
through transformers' fast tokenizer, as vLLM does, so prompt encoding (special tokens added by
the tokenizer's post-processor) and decoding match what users of other engines get.
"""

import json
import os
from dataclasses import dataclass
from importlib import resources

CORPUS = resources.files("rlt.models") / "data" / "corpus.txt"


@dataclass(frozen=True)
class TokenizerSpec:
    """The tokenizer `rlt make-checkpoint` trains for a family (rlt/models/family.py holds each)."""

    front_specials: tuple[str, ...]  # ids 0.. (before the BPE vocabulary)
    back_specials: tuple[str, ...]  # appended after it
    bos: str | None
    eos: str
    pad: str | None
    prepend_bos: bool  # post-processor adds bos to every encoding (Nanbeige, Huginn)
    chat_template: str


# merges the embedded corpus can teach; past it, filler tokens cover the vocabulary
TRAINED_MAX = 1024


def train_tokenizer(spec: TokenizerSpec, vocab_size: int, out_dir: str) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json covering exactly `vocab_size` ids (BPE merges
    learned from the embedded corpus, then fillers `<|fill_N|>`, then the family's trailing special
    tokens: every id a model can sample has text); return the special token ids by role."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, TRAINED_MAX) - len(spec.back_specials),
        special_tokens=list(spec.front_specials),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer)
    # Filler ids go into the BPE vocabulary (no merge makes them: they only decode), not as added
    # tokens, which transformers loads one by one (seconds for a 166K vocabulary).
    model = json.loads(tok.to_str())
    vocab, first = model["model"]["vocab"], tok.get_vocab_size()
    vocab.update({f"<|fill_{i}|>": i for i in range(first, vocab_size - len(spec.back_specials))})
    tok = Tokenizer.from_str(json.dumps(model))
    tok.add_special_tokens(list(spec.back_specials))
    ids = {
        role: tok.token_to_id(t)
        for role, t in (("bos", spec.bos), ("eos", spec.eos), ("pad", spec.pad))
        if t
    }
    if spec.prepend_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{spec.bos} $A",
            pair=f"{spec.bos} $A {spec.bos} $B",
            special_tokens=[(spec.bos, ids["bos"])],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
        "chat_template": spec.chat_template,
        "bos_token": spec.bos,
        "eos_token": spec.eos,
    }
    if spec.pad:
        cfg["pad_token"] = spec.pad
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return ids


def load_tokenizer(path: str):
    """The checkpoint's fast tokenizer (tokenizer.json + tokenizer_config.json), or None when it
    ships none (token-id prompts still work). Loaded as PreTrainedTokenizerFast rather than through
    AutoTokenizer: the latter reads config.json's auto_map and would ask to run remote code. A file
    that is not a JSON object, or a tokenizer that does not load, is a ConfigError naming the file."""
    from rlt.errors import ConfigError
    from rlt.models.json_object import read_json_object

    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        return None
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.isfile(os.path.join(path, name)):
            read_json_object(os.path.join(path, name))
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers/tokenizers raise many types for a bad file
        raise ConfigError(
            f"{path}/tokenizer.json does not load as a tokenizer: {type(e).__name__}: {e}"
        ) from None
