"""CUDA paths: run where an NVIDIA GPU is present (bench/gpu_check.sh runs them); skipped elsewhere."""

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from engine_helpers import STEADY, analysed
from skyline_engine.analysis.session import AnalysisRequest, analyze
from skyline_engine.entry.loader import load_entry_point
from skyline_engine.measure import nvml
from skyline_engine.measure.iteration import IterationRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,  # analyses on the GPU
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def document():
    return analysed(REPO, "examples/cnn/entry_point.py", device="cuda", budget=STEADY)


def test_the_capacity_is_what_this_process_can_use_of_the_gpu(document):
    device = document["device"]
    assert device["type"] == "cuda"
    assert device["name"] == torch.cuda.get_device_name(device["index"])
    assert device["memory_capacity_source"] == "cuda"  # torch.cuda.mem_get_info: free + what we hold
    total = torch.cuda.get_device_properties(device["index"]).total_memory
    assert 0.5 * total <= device["memory_capacity_bytes"] <= total
    nvml_total = nvml.total_memory_bytes(str(torch.cuda.get_device_properties(device["index"]).uuid))
    if nvml_total is not None:
        assert device["memory_capacity_bytes"] <= nvml_total


def test_the_allocator_reserves_at_least_its_allocated_peak(document):
    for measured in (document["iteration"], *document["models"]["samples"]):
        assert measured["peak_memory_reserved_bytes"] >= measured["peak_memory_bytes"] > 0


def test_peak_memory_matches_the_caching_allocator_measured_independently(document):
    spec = importlib.util.spec_from_file_location("cnn_entry", REPO / "examples/cnn/entry_point.py")
    module = importlib.util.module_from_spec(spec)
    # The example's `model` module is forgotten afterwards, as the engine forgets an analysis's:
    # left in sys.modules, it would be the `model` that a later test's project imports.
    sys.path.insert(0, str(REPO / "examples/cnn"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "examples/cnn"))
        sys.modules.pop("model", None)
    with torch.device("cuda"):
        model = module.skyline_model_provider()
        iteration = module.skyline_iteration_provider(model)
        inputs = module.skyline_input_provider(batch_size=document["batch_size"])
    iteration(*inputs)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    iteration(*inputs)
    torch.cuda.synchronize()
    independent = torch.cuda.max_memory_allocated()
    assert document["iteration"]["peak_memory_bytes"] == pytest.approx(independent, rel=0.10)


def test_the_untracked_memory_names_cublas_workspaces(document):
    """cuBLAS keeps a workspace per stream that no tensor holds (65 MiB on an H200, torch 2.11):
    measured by freeing them (torch._C._cuda_clearCublasWorkspaces, which the engine reaches by
    getattr, as CPU builds lack it, so tests/test_torch_apis.py does not see it)."""
    assert hasattr(torch._C, "_cuda_clearCublasWorkspaces")
    untracked = document["untracked"]
    assert 0 < untracked["workspace_bytes"] <= untracked["memory_bytes"]


def test_models_and_breakdown_on_cuda(document):
    samples = sorted(document["models"]["samples"], key=lambda s: s["batch_size"])
    peaks = [s["peak_memory_bytes"] for s in samples]
    assert peaks == sorted(peaks)
    assert all(s["run_time_ms"] > 0 for s in samples)
    conv_lines = [e for e in document["lines"] if e["path"] == "examples/cnn/model.py"]
    assert any(e["forward_ms"] > 0 and e["backward_ms"] > 0 for e in conv_lines)
    # Backward runs on autograd's device thread: the meter and the recorder still see the
    # operations one for one, so the peak's operation has a line of the project.
    peak = document["peak_memory_operation"]
    assert peak is not None and peak["path"] in {"examples/cnn/model.py", "examples/cnn/entry_point.py"}, peak


def test_a_device_other_than_the_current_one_is_the_one_measured():
    """Events record on the current device's stream: the analysis makes its device the current
    one (on a machine with one GPU, index 0 is both, and this checks only that it runs)."""
    index = torch.cuda.device_count() - 1
    torch.cuda.set_device(0)
    doc = analyze(AnalysisRequest("examples/cnn/entry_point.py", REPO, device=f"cuda:{index}", budget=STEADY))
    assert doc.device.torch_device.index == index
    assert torch.cuda.current_device() == index
    assert doc.iteration.run_time_ms > 0 and doc.iteration.peak_memory_bytes > 0


def test_the_runner_takes_plain_cuda_as_the_current_device():
    """`torch.device("cuda")` has no index, and torch.cuda.set_device needs one (torch 2.11 raised
    here on the first GPU check, from bench/run.py)."""
    loaded = load_entry_point(REPO / "examples/cnn/entry_point.py", REPO)
    try:
        with IterationRunner(loaded, torch.device("cuda"), STEADY) as runner:
            assert runner.device == torch.device("cuda", torch.cuda.current_device())
            assert runner.memory_at(8).peak_bytes > 0
    finally:
        loaded.unload()


def test_memory_kept_for_good_is_found_on_cuda_and_nothing_in_the_examples(document):
    """Backward runs on autograd's device thread, and the caching allocator hands freed blocks out
    again: the new storages are still told apart, a clean iteration keeps none, and a leaking
    one is named at the lines that made it."""
    assert document["memory_growth"] is None
    training_loops = REPO / "tests" / "projects" / "training_loops"
    growth = analysed(training_loops, "keeps_graphs.py", device="cuda", budget=STEADY, predict=False)["memory_growth"]
    assert growth is not None and growth["lines"][0]["path"] == "model.py", growth
    assert growth["lines"][0]["line"] == 12 and growth["lines"][0]["bytes"] == 2 * 32 * 256 * 4


def test_each_operation_takes_its_kernels_time_and_keeps_its_span(document):
    """torch.profiler's kernels, by the operation that launched them (attribute/kernels.py)."""
    attribution = document["attribution"]
    assert attribution["device_time"] == "kernels", attribution["device_time_fallback"]
    timeline = analysed(REPO, "examples/cnn/entry_point.py", device="cuda", predict=False, timeline=True)["timeline"]
    backward = [op for op in timeline if op["phase"] == "backward"]
    assert backward and sum(op["duration_ms"] for op in backward) > 0  # kernels on autograd's device thread too
    assert all(op["span_ms"] is not None and op["span_ms"] >= 0 for op in timeline)
    assert sum(op["duration_ms"] for op in timeline) <= document["iteration"]["run_time_ms"] * 1.5


def test_a_compiled_models_peak_is_its_own_programs():
    compiled = analysed(REPO, "bench/models/compiled_transformer/entry_point.py", device="cuda", predict=False)
    assert compiled["compilation"]["peak_memory"] == "compiled_program"
    assert compiled["peak_memory_operation"] is None
    parts = compiled["peak_memory_parts"]
    assert sum(parts.values()) == compiled["iteration"]["peak_memory_bytes"]
