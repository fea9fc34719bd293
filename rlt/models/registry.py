"""model_type -> the family's tensor names, model class and checkpoint quirks."""

from dataclasses import dataclass
from typing import Callable

from rlt.config import ModelConfig
from rlt.models import huginn, nanbeige, ouro


@dataclass(frozen=True)
class FamilySpec:
    expected_tensors: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    model_cls: type
    embed_name: str
    ignored_suffixes: tuple[str, ...]  # buffers that may be stored but are recomputed


FAMILIES = {
    "ouro": FamilySpec(ouro.expected_tensors, ouro.OuroModel, "model.embed_tokens.weight",
                       ("rotary_emb.inv_freq",)),
    "nanbeige": FamilySpec(nanbeige.expected_tensors, nanbeige.NanbeigeModel, "model.embed_tokens.weight",
                           ("rotary_emb.inv_freq",)),
    "huginn_raven": FamilySpec(huginn.expected_tensors, huginn.HuginnModel, "transformer.wte.weight",
                               ("freqs_cis",)),
}
