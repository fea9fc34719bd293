"""rlt: a serving engine for recurrent-depth (looped) language models."""

from rlt.contract.sampling_params import SamplingParams, StructuredOutput
from rlt.control.frontend import Engine
from rlt.control.outputs import RequestOutput
from rlt.errors import (
    CheckpointError,
    ConfigError,
    EngineDeadError,
    EngineOverloadedError,
    RequestError,
)
from rlt.models.model_config import KVGeometry, ModelConfig

__all__ = [
    "Engine",
    "ModelConfig",
    "KVGeometry",
    "SamplingParams",
    "StructuredOutput",
    "RequestOutput",
    "RequestError",
    "ConfigError",
    "CheckpointError",
    "EngineDeadError",
    "EngineOverloadedError",
]
