"""Preallocated host/device buffers: a step's metadata goes to the device in one copy.

Integer fields are packed into one int64 host buffer (pinned on CUDA, two used in turn), copied with
a single non-blocking transfer, and handed out as device views. Float fields travel as their
float32 bit patterns in the same buffer; typed metadata (a dataclass of arrays) keeps its type.
"""

import copy

import numpy as np
import torch

# Every field starts on a 16-byte boundary (2 int64s): Triton specializes a kernel on whether each
# pointer argument is 16-byte aligned, so fields at arbitrary offsets would build a new variant
# whenever a pass's packing moved one across the boundary.
ALIGN = 2


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class StepBuffers:
    def __init__(self, device: str, capacity: int = 1 << 20):
        self.device = torch.device(device)
        self._alloc(capacity)

    def _alloc(self, capacity: int) -> None:
        cuda = self.device.type == "cuda"
        # Two pinned staging buffers, used in turn: the host fills one while the copy of the other
        # may still be in flight (steps without a read-back let the host run ahead of the GPU).
        self.hosts = [
            torch.empty(capacity, dtype=torch.int64, pin_memory=cuda)
            for _ in range(2 if cuda else 1)
        ]
        self.copied = [None] * len(self.hosts)  # CUDA event: that buffer's last copy is done
        self.turn, self.end = 0, 0
        self.host = self.hosts[0]
        # One device buffer is enough: copies and the kernels reading them share a stream, in order.
        self.dev = (
            self.host if not cuda else torch.empty(capacity, dtype=torch.int64, device=self.device)
        )

    def pack(self, fields: dict, append: bool = False) -> dict:
        """fields: name -> int64 or float32 array (any shape), or a dataclass (the pass metadata,
        rlt/kernels/paged_attention.PagedMetadata) whose array fields and arrays in dict fields
        travel alike. Returns device tensors of the same shapes (a dataclass: a copy holding them).
        append: a second pack in the same step, placed after the first (whose device views kernels
        queued later in the step still read)."""
        arrays, typed = {}, {}
        for k, v in fields.items():
            if isinstance(v, np.ndarray):
                arrays[k] = v
                continue
            typed[k] = v
            for name, x in vars(v).items():
                if isinstance(x, np.ndarray):
                    arrays[(k, name)] = x
                elif isinstance(x, dict):
                    arrays |= {(k, name, n): a for n, a in x.items()}
        out = self._pack(arrays, append)
        for k, v in typed.items():
            v = out[k] = copy.copy(v)
            for name, x in list(vars(v).items()):
                if isinstance(x, np.ndarray):
                    setattr(v, name, out.pop((k, name)))
                elif isinstance(x, dict):
                    setattr(v, name, {n: out.pop((k, name, n)) for n in x})
        return out

    def _pack(self, fields: dict, append: bool) -> dict:
        # (floats as their bit patterns; every array is cast to int64 as it is written into the
        # buffer)
        arrays = {
            k: (v.astype(np.float32).view(np.int32) if v.dtype.kind == "f" else v)
            for k, v in fields.items()
        }
        start = _aligned(self.end) if append else 0
        total = start + sum(_aligned(a.size) for a in arrays.values())
        if total > self.host.numel():
            if append:  # keep the first pack's buffers alive: this one goes to fresh ones
                return StepBuffers(self.device, 2 * total)._pack(fields, False)
            self._alloc(max(total, 2 * self.host.numel()))
        if not append:
            self.turn = (self.turn + 1) % len(self.hosts)
            self.host = self.hosts[self.turn]
            if self.copied[self.turn] is not None:
                self.copied[self.turn].synchronize()
        self.end = total
        host = self.host.numpy()
        off, spans = start, {}
        for k, a in arrays.items():
            host[off : off + a.size] = a.ravel()
            spans[k] = (off, a.size, a.shape)
            off += _aligned(a.size)
        if self.dev is not self.host:
            self.dev[start:total].copy_(self.host[start:total], non_blocking=True)
            self.copied[self.turn] = torch.cuda.Event()
            self.copied[self.turn].record()
        out = {}
        for k, (o, size, shape) in spans.items():
            t = self.dev[o : o + size].view(shape)
            out[k] = t.to(torch.int32).view(torch.float32) if fields[k].dtype.kind == "f" else t
        return out


class DeviceReadback:
    """Device tensors on their way to the host: on CUDA copied into fresh pinned memory without
    waiting (the host launches more work first); resolve() waits for the copy and returns lists."""

    def __init__(self, tensors: tuple[torch.Tensor, ...]):
        if tensors[0].is_cuda:
            self._host = tuple(
                torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors
            )
            for h, t in zip(self._host, tensors):
                h.copy_(t, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = tensors, None

    def ready(self) -> bool:
        """Has the copy finished (resolve() would not wait)?"""
        return self._event is None or self._event.query()

    def resolve(self) -> tuple[list, ...]:
        if self._event is not None:
            self._event.synchronize()
        return tuple(h.tolist() for h in self._host)
