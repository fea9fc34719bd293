"""Error types of the public API. Each names the field (or tensor, or worker) at fault."""


class ConfigError(ValueError):
    """A config.json (after hf_overrides) the engine cannot run; the message names the field."""


class CheckpointError(ValueError):
    """A checkpoint whose files or tensors do not match the ModelConfig; names the tensor."""


class RequestError(ValueError):
    """A request that violates a limit; raised before any worker sees it. Names field and limit."""


class EngineDeadError(RuntimeError):
    """A worker died or stopped answering; carries the worker's own error text."""


class EngineOverloadedError(RuntimeError):
    """The engine holds as many requests as it queues (max_queued_requests): refused at the call,
    before anything is queued. Retry later (HTTP 503 with Retry-After)."""
