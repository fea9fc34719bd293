"""Which device each worker runs on, and whether the machine has them (asked before anything starts)."""

import asyncio
import sys


def device_for(device: str, slot: int, slots: int, local: int) -> str:
    """One device per worker on GPU (cuda:0, cuda:1, ... in slot order); all on CPU otherwise. Of
    `slots`, the first `slots - local` are remote (a Dynamo decode node's prefill proxies): no device."""
    if device == "cpu" or (local == 1 and device != "cuda"):
        return device
    return f"cuda:{slot - (slots - local)}"


async def check_devices(device: str, topology: str, local: int) -> None:
    """CUDA present, and a device for each of `local` workers: asked of a probe process (the
    coordinator imports no torch)."""
    if device == "cpu":
        return
    need = local if local > 1 else int(device.partition(":")[2] or 0) + 1
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import torch; print(torch.cuda.device_count())",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await probe.communicate()
    have = int(out) if out.strip().isdigit() else 0
    if have < need:
        raise ValueError(
            f"device {device!r} with topology {topology!r} needs {need} CUDA device(s); this machine has {have}"
        )
