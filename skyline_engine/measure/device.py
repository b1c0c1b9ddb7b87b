"""Which device the analysis runs on, what it is called, and how much memory it has."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

import torch

from skyline_engine.errors import SkylineError
from skyline_engine.measure import nvml


@dataclass(frozen=True)
class DeviceInfo:
    torch_device: torch.device
    name: str
    memory_capacity_bytes: int
    capacity_source: str  # "nvml", "cuda" (torch's device properties) or "physical-memory"

    @property
    def type(self) -> str:
        return self.torch_device.type

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "index": self.torch_device.index,
            "name": self.name,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "memory_capacity_source": self.capacity_source,
        }


def torch_version() -> str:
    """The version of torch that measures (the document's `torch_version`)."""
    return str(torch.__version__)


def resolve_device(spec: str) -> torch.device:
    """`auto`, `cpu`, `cuda` or `cuda:N` to a torch device, with a clear error when it is absent."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise SkylineError(f"unknown device {spec!r}.", hint="Use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise SkylineError(f"device {spec!r} is not supported.", hint="Use auto, cpu, cuda or cuda:N.")
    if not torch.cuda.is_available():
        raise SkylineError(
            f"device {spec!r} was asked for, but no CUDA device is available "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False).",
            hint="Use --device cpu, or run on a machine with an NVIDIA GPU.",
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise SkylineError(
            f"device {spec!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)."
        )
    return torch.device("cuda", index)


def describe_device(device: torch.device) -> DeviceInfo:
    if device.type == "cuda":
        return _describe_cuda(device)
    return DeviceInfo(device, _cpu_name(), _physical_memory_bytes(), "physical-memory")


def _describe_cuda(device: torch.device) -> DeviceInfo:
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "") or None
    total = nvml.total_memory_bytes(uuid, device.index)
    if total is not None:
        return DeviceInfo(device, props.name, total, "nvml")
    return DeviceInfo(device, props.name, int(props.total_memory), "cuda")


def _physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"
