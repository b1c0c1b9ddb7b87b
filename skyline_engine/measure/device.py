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
    capacity_source: str  # "user", "cuda", "nvml", "system_available", "cgroup" or "physical_memory"

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


def describe_device(device: torch.device, memory_capacity_bytes: int | None = None) -> DeviceInfo:
    """The device, with the memory the analysis may plan for: `memory_capacity_bytes` when the
    user gives one (to plan for another device: "will this fit on a 24 GiB card?"), else what
    this process can use there now."""
    name = torch.cuda.get_device_properties(device).name if device.type == "cuda" else _cpu_name()
    if memory_capacity_bytes is not None:
        return DeviceInfo(device, name, memory_capacity_bytes, "user")
    if device.type == "cuda":
        return DeviceInfo(device, name, *_cuda_capacity(device))
    return DeviceInfo(device, name, *cpu_capacity())


def _cuda_capacity(device: torch.device) -> tuple[int, str]:
    """What this process can use of the GPU: free memory plus what its caching allocator holds
    already (other processes, the CUDA context and MIG slices are left out, which a GPU's total
    would not)."""
    try:
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + int(torch.cuda.memory_reserved(device)), "cuda"
    except RuntimeError:
        pass
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "") or None
    total = nvml.total_memory_bytes(uuid)
    if total is not None:
        return total, "nvml"
    return int(props.total_memory), "cuda"


def cpu_capacity(root: str = "/") -> tuple[int, str]:
    """What a process can use of the machine's memory, and where that figure comes from: the
    memory available now (MemAvailable: free memory plus what the kernel can reclaim, not the
    total, most of which other processes may hold), or the room left in this process's control
    group when that is less. `root` is where /proc and /sys are (tests point it elsewhere)."""
    available = _meminfo_available(root)
    room = _cgroup_room(root)
    if room is not None and (available is None or room < available):
        return room, "cgroup"
    if available is not None:
        return available, "system_available"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical_memory"


def _meminfo_available(root: str) -> int | None:
    try:
        with open(os.path.join(root, "proc/meminfo"), encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# A cgroup limit at or above this is "no limit" (cgroup v1 writes 2^63 rounded down to a page).
_NO_LIMIT = 1 << 60


def _cgroup_room(root: str) -> int | None:
    """The least room under the memory limits of this process's control group and its ancestors
    (each limit less that group's usage; cgroup v2, and v1), or None without a limit. An ancestor's
    limit holds too: the service runs each worker in a cgroup of its own below the service's
    (processes.Cgroup), and a limit set where the editor was started is the service's."""
    rooms = []
    for relative in _cgroup_paths(root):
        for limit_name, usage_name in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            limit = _read_int(os.path.join(root, relative, limit_name))
            usage = _read_int(os.path.join(root, relative, usage_name))
            if limit is not None and usage is not None and limit < _NO_LIMIT:
                rooms.append(max(0, limit - usage))
    return min(rooms) if rooms else None


def _cgroup_paths(root: str) -> list[str]:
    """Where this process's memory cgroup may be mounted: its own path under the v2 and v1
    hierarchies and each of their ancestors, up to their roots (a container sees its own cgroup
    as the root)."""
    own = []
    try:
        with open(os.path.join(root, "proc/self/cgroup"), encoding="ascii") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    own.append(("sys/fs/cgroup", path))
                elif "memory" in controllers.split(","):
                    own.append(("sys/fs/cgroup/memory", path))
    except (OSError, ValueError):
        pass
    paths = []
    for mount, path in [*own, ("sys/fs/cgroup", "/"), ("sys/fs/cgroup/memory", "/")]:
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            paths.append("/".join([mount, *parts[:depth]]))
    return list(dict.fromkeys(paths))


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return _NO_LIMIT
    try:
        return int(text)
    except ValueError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"
