"""rlt: a serving engine for recurrent-depth (looped) language models."""

from rlt.config import KVGeometry, ModelConfig
from rlt.control.frontend import Engine
from rlt.errors import CheckpointError, ConfigError, EngineDeadError, EngineOverloadedError, RequestError
from rlt.outputs import RequestOutput
from rlt.sampling_params import SamplingParams, StructuredOutput

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
