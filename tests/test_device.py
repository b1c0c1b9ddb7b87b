"""Device selection and capacity. This machine class has no GPU; CUDA paths are in test_gpu.py."""

import os
import sys
import types

import pytest
import torch

from skyline_engine.cli.serve import check_memory_limit_fits_the_device
from skyline_engine.errors import SkylineError
from skyline_engine.measure import nvml
from skyline_engine.measure.device import cpu_capacity, describe_device, resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


def test_cpu_capacity_is_the_memory_available_not_the_total():
    info = describe_device(resolve_device("cpu"))
    assert info.type == "cpu"
    assert info.to_dict()["memory_capacity_source"] in ("system_available", "cgroup")
    assert 0 < info.memory_capacity_bytes < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_capacity_given_by_the_user_is_planned_for():
    info = describe_device(resolve_device("cpu"), 24 << 30)
    assert (info.memory_capacity_bytes, info.capacity_source) == (24 << 30, "user")


MEMINFO = "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n"


def fake_system(root, meminfo=MEMINFO, cgroup=None, files=None):
    """/proc and /sys under `root`, holding what the kernel would show (fixed numbers)."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(meminfo)
    (root / "proc" / "self" / "cgroup").write_text(cgroup or "0::/\n")
    for name, text in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_available_memory_when_no_control_group_limits_it(tmp_path):
    root = fake_system(tmp_path, files={"sys/fs/cgroup/memory.max": "max\n", "sys/fs/cgroup/memory.current": "5\n"})
    assert cpu_capacity(root) == (20000000 * 1024, "system_available")


def test_a_cgroup_v2_limit_below_the_available_memory_wins(tmp_path):
    root = fake_system(
        tmp_path,
        cgroup="0::/user.slice/job\n",
        files={
            "sys/fs/cgroup/user.slice/job/memory.max": str(8 << 30),
            "sys/fs/cgroup/user.slice/job/memory.current": str(3 << 30),
        },
    )
    assert cpu_capacity(root) == (5 << 30, "cgroup")


def test_a_limit_on_an_ancestor_cgroup_holds_below_it(tmp_path):
    # The service runs its worker in a cgroup of its own below the service's, which has the limit.
    root = fake_system(
        tmp_path,
        cgroup="0::/user.slice/job/skyline-worker-1-2\n",
        files={
            "sys/fs/cgroup/user.slice/job/memory.max": str(8 << 30),
            "sys/fs/cgroup/user.slice/job/memory.current": str(3 << 30),
            "sys/fs/cgroup/user.slice/job/skyline-worker-1-2/memory.max": "max\n",
            "sys/fs/cgroup/user.slice/job/skyline-worker-1-2/memory.current": str(1 << 30),
        },
    )
    assert cpu_capacity(root) == (5 << 30, "cgroup")


def test_a_cgroup_v1_limit_seen_from_inside_a_container(tmp_path):
    # The container's own cgroup is the root of its memory hierarchy; its path in
    # /proc/self/cgroup names the host's view, which is not mounted here.
    root = fake_system(
        tmp_path,
        cgroup="4:memory:/docker/abc\n0::/\n",
        files={
            "sys/fs/cgroup/memory/memory.limit_in_bytes": str(4 << 30),
            "sys/fs/cgroup/memory/memory.usage_in_bytes": str(1 << 30),
        },
    )
    assert cpu_capacity(root) == (3 << 30, "cgroup")


def test_a_cgroup_v1_without_a_limit_leaves_the_available_memory(tmp_path):
    root = fake_system(
        tmp_path,
        files={
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": str(1 << 30),
        },
    )
    assert cpu_capacity(root) == (20000000 * 1024, "system_available")


@no_cuda
def test_auto_falls_back_to_cpu_without_cuda():
    assert resolve_device("auto").type == "cpu"


@no_cuda
@pytest.mark.parametrize("spec", ["cuda", "cuda:1", "CUDA:0"])
def test_asking_for_cuda_without_it_is_a_clear_error(spec):
    with pytest.raises(SkylineError, match="no CUDA device is available"):
        resolve_device(spec)


@pytest.mark.parametrize("spec", ["tpu", "gpu0", "mps"])
def test_unknown_or_unsupported_devices_are_refused(spec):
    with pytest.raises(SkylineError, match="device"):
        resolve_device(spec)


@no_cuda
def test_nvml_without_a_driver_reports_nothing_instead_of_failing():
    # Real pynvml (nvidia-ml-py) on a machine without an NVIDIA driver: nvmlInit fails.
    assert nvml.total_memory_bytes("0c1a2b3c-0000-4000-8000-000000000000") is None


class _FakeNvml:
    """Stands in for pynvml, the one seam to NVIDIA hardware this machine does not have: a MIG
    slice of 20 GiB on a GPU of 141 GiB, found by name only."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        self.devices = {"GPU-aaaa": 141 << 30, "MIG-bbbb": 20 << 30}
        self.asked: list[str] = []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, name):
        self.asked.append(name)
        if name not in self.devices:
            raise self.NVMLError(name)
        return name

    def nvmlDeviceGetHandleByIndex(self, index):
        raise AssertionError("a device must never be found by index")

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=self.devices[handle])

    def nvmlDeviceGetCount(self):
        return 1


@pytest.mark.parametrize(
    ("uuid", "total", "asked"),
    [
        ("aaaa", 141 << 30, ["GPU-aaaa"]),  # a whole GPU: torch's bare UUID
        ("bbbb", 20 << 30, ["GPU-bbbb", "MIG-bbbb"]),  # a MIG slice: its own memory, not the GPU's
        ("MIG-bbbb", 20 << 30, ["MIG-bbbb"]),
        ("cccc", None, ["GPU-cccc", "MIG-cccc"]),  # unknown: nothing, not the GPU at some index
        (None, None, []),
    ],
)
def test_nvml_finds_a_gpu_or_a_mig_slice_by_uuid_and_never_by_index(monkeypatch, uuid, total, asked):
    fake = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml.total_memory_bytes(uuid) == total
    assert fake.asked == asked


@pytest.mark.parametrize("spec", ["cuda", "cuda:1", "CUDA"])
def test_a_worker_memory_limit_with_cuda_is_refused(spec):
    with pytest.raises(SkylineError, match="CUDA cannot start under such a cap"):
        check_memory_limit_fits_the_device(spec)


def test_a_worker_memory_limit_with_auto_is_refused_where_nvml_sees_a_gpu(monkeypatch):
    # NVML stands in for the GPU this machine does not have (the one hardware seam).
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(SkylineError, match="--device auto would quietly leave unused"):
        check_memory_limit_fits_the_device("auto")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # every GPU hidden: the CPU it is
    check_memory_limit_fits_the_device("auto")


def test_a_worker_memory_limit_on_the_cpu_is_taken():
    check_memory_limit_fits_the_device("cpu")
    check_memory_limit_fits_the_device("auto")  # this machine: no NVIDIA driver, so no GPU
