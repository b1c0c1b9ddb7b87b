"""The one seam to NVIDIA's management library (NVML, `import pynvml` from nvidia-ml-py).

Tests on machines without a GPU stand in for `pynvml` here and nowhere else.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def handle_names(uuid: str | None) -> list[str]:
    """The names NVML may know a CUDA device by, from the UUID torch gives: a whole GPU is
    `GPU-<uuid>`, a MIG slice `MIG-<uuid>`; torch gives the bare UUID of either."""
    if not uuid:
        return []
    if uuid.startswith(("GPU-", "MIG-")):
        return [uuid]
    return ["GPU-" + uuid, "MIG-" + uuid]


def total_memory_bytes(uuid: str | None) -> int | None:
    """Total memory of a GPU or MIG slice as NVML reports it, or None when NVML does not know it.

    The device is found by its UUID only, never by index: CUDA_VISIBLE_DEVICES renumbers devices
    for CUDA but not for NVML, and on a MIG slice the index names the whole GPU.
    """
    names = handle_names(uuid)
    if not names:
        return None
    with _nvml() as pynvml:
        if pynvml is None:
            return None
        for name in names:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(name)
            except pynvml.NVMLError:
                continue
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    return None


def visible_gpu_count() -> int:
    """How many NVIDIA GPUs this process could use, asked of NVML without starting CUDA (which
    cannot start under an address-space limit); 0 when CUDA_VISIBLE_DEVICES hides them all or
    NVML is not usable here."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    with _nvml() as pynvml:
        if pynvml is not None:
            return int(pynvml.nvmlDeviceGetCount())
    return 0


@contextlib.contextmanager
def _nvml() -> Iterator[Any]:
    """NVML, initialised, and shut down afterwards; None when it is not usable here (no package,
    no driver). An NVML error inside the `with` ends it quietly: the caller goes on after it, where
    it answers that it does not know."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    except pynvml.NVMLError:
        pass
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
