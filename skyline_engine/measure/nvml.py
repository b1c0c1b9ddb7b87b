"""The one seam to NVIDIA's management library (NVML, `import pynvml` from nvidia-ml-py).

Tests on machines without a GPU replace `total_memory_bytes` here and nowhere else.
"""

from __future__ import annotations

import contextlib


def total_memory_bytes(uuid: str | None, index: int) -> int | None:
    """Total memory of a GPU as NVML reports it, or None when NVML is not usable here.

    The GPU is found by its UUID when torch gives one (CUDA_VISIBLE_DEVICES renumbers devices
    for CUDA but not for NVML), else by index.
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = None
        if uuid:
            name = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(name)
            except pynvml.NVMLError:
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
