"""Device selection and capacity. This machine class has no GPU; CUDA paths are in test_gpu.py."""

import os

import pytest
import torch

from skyline_engine.errors import SkylineError
from skyline_engine.measure import nvml
from skyline_engine.measure.device import describe_device, resolve_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


def test_cpu_capacity_is_physical_memory():
    info = describe_device(resolve_device("cpu"))
    assert info.type == "cpu"
    assert info.memory_capacity_bytes == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert info.to_dict()["memory_capacity_source"] == "physical-memory"


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
    assert nvml.total_memory_bytes(None, 0) is None
