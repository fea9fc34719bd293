"""Preallocated host/device buffers: a step's metadata goes to the device in one copy.

Integer fields are packed into one int64 host buffer (pinned on CUDA), copied with a single
non-blocking transfer, and handed out as device views. Float fields travel as their float32 bit
patterns in the same buffer.
"""

import numpy as np
import torch


class StepBuffers:
    def __init__(self, device: str, capacity: int = 1 << 14):
        self.device = torch.device(device)
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        pin = self.device.type == "cuda"
        self.host = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
        self.dev = self.host if self.device.type == "cpu" else torch.empty(capacity, dtype=torch.int64,
                                                                           device=self.device)

    def pack(self, fields: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """fields: name -> int64 or float32 array (any shape). Returns device tensors of the same shapes."""
        arrays = {k: (v.astype(np.float32).view(np.int32).astype(np.int64) if v.dtype.kind == "f"
                      else v.astype(np.int64)) for k, v in fields.items()}
        total = sum(a.size for a in arrays.values())
        if total > self.host.numel():
            self._alloc(max(total, 2 * self.host.numel()))
        host = self.host.numpy()
        off, spans = 0, {}
        for k, a in arrays.items():
            host[off:off + a.size] = a.ravel()
            spans[k] = (off, a.shape)
            off += a.size
        if self.dev is not self.host:
            self.dev[:total].copy_(self.host[:total], non_blocking=True)
        out = {}
        for k, (o, shape) in spans.items():
            t = self.dev[o:o + int(np.prod(shape, dtype=np.int64))].view(shape)
            out[k] = t.to(torch.int32).view(torch.float32) if fields[k].dtype.kind == "f" else t
        return out
