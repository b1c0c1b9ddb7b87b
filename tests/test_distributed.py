"""Data-parallel training, end to end on the CPU: two ranks over gloo, started by `skyline profile
--nproc 2` (torch's elastic launch) and by torchrun itself; what a failing rank leaves behind."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch.distributed

from conftest import REPO, run_skyline
from engine_helpers import marked_line
from skyline_engine.render.terminal import render_report

PROJECT = REPO / "tests" / "projects" / "data_parallel"
# WideMLP's parameters: 64·1024+1024, 1024·512+512, 512·10+10 floats.
GRADIENT_BYTES = 4 * (64 * 1024 + 1024 + 1024 * 512 + 512 + 512 * 10 + 10)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "analysis.json"
    result = run_skyline("profile", "entry_point.py", "--nproc", "2", "--device", "cpu", "--json", out, cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()), result.stdout


@pytest.mark.slow
def test_every_rank_is_measured_and_the_slowest_named(profiled):
    doc, _ = profiled
    dp = doc["distributed"]
    assert (dp["world_size"], dp["backend"]) == (2, "gloo")
    assert dp["threads_per_rank"] >= 1
    assert [r["rank"] for r in dp["ranks"]] == [0, 1]
    for rank in dp["ranks"]:
        assert rank["run_time_ms"] > 0 and rank["compute_ms"] > 0 and rank["peak_memory_bytes"] > 0
    slowest = max(dp["ranks"], key=lambda r: r["compute_ms"])["rank"]
    assert dp["slowest_rank"] == slowest
    assert doc["iteration"]["run_time_ms"] == dp["ranks"][0]["run_time_ms"]
    assert doc["models"] is None and "one batch size" in doc["models_withheld"]
    assert doc["memory_growth"] is None  # the ranks' iterations keep nothing for good


@pytest.mark.slow
def test_buckets_hold_every_gradient_once_with_the_lines_that_made_them(profiled):
    doc, _ = profiled
    buckets = doc["distributed"]["buckets"]
    assert len(buckets) >= 2  # the first bucket holds at most 1 MiB
    assert sum(b["size_bytes"] for b in buckets) == GRADIENT_BYTES
    names = [name for b in buckets for name in b["parameters"]]
    assert sorted(names) == sorted(f"model.{m}.{p}" for m in ("inner", "middle", "head") for p in ("weight", "bias"))
    # What each all-reduce added to the communication: the first one's all of its time; a later one
    # may add nothing, having run within the one before it (gloo runs two at once).
    assert buckets[0]["all_reduce_ms"] > 0
    for bucket in buckets:
        assert bucket["all_reduce_ms"] >= 0 and bucket["exposed_ms"] >= 0
        assert {line["path"] for line in bucket["lines"]} <= {"model.py"}
    lines = {line["line"] for b in buckets for line in b["lines"]}
    source = (PROJECT / "model.py").read_text().splitlines()
    called = {n for n, text in enumerate(source, 1) if "self.inner(" in text or "self.middle(" in text}
    created = {n for n, text in enumerate(source, 1) if "nn.Linear(" in text}
    assert called <= lines and created <= lines


@pytest.mark.slow
def test_the_report_says_a_bucket_that_added_no_time_ran_within_the_earlier_ones(profiled):
    # The measured document, with its second bucket's all-reduce set to what a run where it finished
    # within the first's gives (which one a run gives depends on the scheduler).
    doc = copy.deepcopy(profiled[0])
    first, second = doc["distributed"]["buckets"][:2]
    second["all_reduce_ms"] = 0.0
    report = render_report(doc)
    assert re.search(rf"bucket {second['index']} .* all-reduce within bucket {first['index']}'s, exposed", report)
    assert re.search(rf"bucket {first['index']} .* all-reduce \d+\.\d+ ms, exposed", report)
    assert "all-reduce 0.00 ms" not in report
    # Behind two buckets, it may have ended within either one's all-reduce: neither is named.
    doc["distributed"]["buckets"].insert(1, copy.deepcopy(first))
    assert "all-reduce within the earlier buckets', exposed" in render_report(doc)


@pytest.mark.slow
def test_exposed_communication_is_shared_among_the_lines_that_cause_it(profiled):
    doc, _ = profiled
    exposed = sum(b["exposed_ms"] for b in doc["distributed"]["buckets"])
    on_lines = [line for line in doc["lines"] if line["communication_ms"]]
    assert sum(line["communication_ms"] for line in on_lines) == pytest.approx(exposed)
    assert all(line["path"] == "model.py" for line in on_lines)
    assert all(line["communication_ms"] is not None for line in doc["lines"])


@pytest.mark.slow
def test_scaling_is_predicted_to_64_ranks_and_marked_beyond_the_measured(profiled):
    doc, report = profiled
    dp = doc["distributed"]
    rows = dp["scaling"]
    assert [r["world_size"] for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    assert [r["extrapolated"] for r in rows] == [w > 2 for w in (1, 2, 4, 8, 16, 32, 64)]
    assert rows[0]["exposed_ms"] == 0
    measured = rows[1]
    iteration = max(r["run_time_ms"] for r in dp["ranks"])
    assert measured["measured_samples_per_second"] == pytest.approx(2 * doc["batch_size"] / iteration * 1000)
    # Calibrated there: the prediction at the measured world size is the measurement (never faster
    # than the iteration without communication, should noise have timed it slower).
    compute = dp["ranks"][dp["slowest_rank"]]["compute_ms"]
    assert measured["iteration_ms"] == pytest.approx(max(iteration, compute))
    assert all(r["measured_samples_per_second"] is None for r in rows if r["world_size"] != 2)
    assert dp["link"]["description"] == "loopback (gloo on one machine)" and dp["link"]["source"] == "measured"
    assert dp["link"]["bandwidth_gbps"] > 0 and dp["link"]["latency_us"] >= 0
    assert "Data parallel  2 ranks (gloo" in report and "64 ranks" in report


@pytest.mark.slow
def test_a_rank_that_keeps_memory_for_good_says_where(tmp_path):
    out = tmp_path / "analysis.json"
    result = run_skyline("profile", "keeps_graphs.py", "--nproc", "2", "--device", "cpu", "--json", out, cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    growth = json.loads(out.read_text())["memory_growth"]
    # model.py:16 and :17, `hidden = self.inner(x).relu()` and the next: the ReLUs' outputs the
    # kept graphs saved, 16 samples of 1024 and of 512 floats.
    assert growth["lines"][:2] == [
        {"path": "model.py", "line": 16, "bytes": 4 * 16 * 1024},
        {"path": "model.py", "line": 17, "bytes": 4 * 16 * 512},
    ]
    assert "Tensor memory grows by" in " ".join(result.stdout.split())


@pytest.mark.slow
def test_calls_that_differ_are_measured_in_whole_cycles_on_every_rank(tmp_path):
    # Every fifth call evaluates the model: call by call, the ranks' peaks and the breakdown left
    # the evaluation out, unwarned (17.5 MiB for 33.2 in a larger trial). The ranks agree on the
    # cycle and run the same calls, or their all-reduces would wait for each other for ever.
    out = tmp_path / "analysis.json"
    entry = "evaluates_every_few_calls.py"
    result = run_skyline("profile", entry, "--nproc", "2", "--device", "cpu", "--json", out, cwd=PROJECT)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    (warning,) = [w for w in doc["warnings"] if w.startswith("Your iteration does not do the same work")]
    assert "ran the model twice (one call in 5)" in warning and "whole cycles of 5 calls" in warning
    assert doc["attribution"]["recorded_iterations"] == 5
    marker = marked_line(PROJECT / entry, "# EVALUATE")
    evaluation = next(e for e in doc["lines"] if (e["path"], e["line"]) == (entry, marker))
    assert evaluation["inclusive"]["forward_ms"] > 0
    # Each rank's peak is the evaluation's: the 512 × 1024 and 512 × 512 activations of its
    # middle layer at once, beyond the weights and their gradients.
    evaluation_bytes = 4 * 512 * (1024 + 512)
    assert all(r["peak_memory_bytes"] >= 2 * GRADIENT_BYTES + evaluation_bytes for r in doc["distributed"]["ranks"])
    assert doc["iteration"]["repetitions"] % 5 == 0


@pytest.mark.slow
def test_a_planned_interconnect_replaces_the_measured_link(tmp_path):
    out = tmp_path / "planned.json"
    result = run_skyline(
        "profile", "entry_point.py", "--nproc", "2", "--interconnect-gbps", "100", "--json", out, "--quiet", cwd=PROJECT
    )
    assert result.returncode == 0, result.stderr
    link = json.loads(out.read_text())["distributed"]["link"]
    assert (link["source"], link["bandwidth_gbps"]) == ("user", pytest.approx(100))


@pytest.mark.slow
def test_under_torchrun_each_process_joins_and_rank_0_reports(tmp_path):
    out = tmp_path / "torchrun.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += ["-m", "skyline_engine", "profile", "entry_point.py", "--device", "cpu", "--quiet", "--json", str(out)]
    result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    dp = json.loads(out.read_text())["distributed"]
    assert dp["world_size"] == 2 and len(dp["ranks"]) == 2
    assert result.stdout.count("Data parallel") == 1  # rank 0's report only


SCRIPTS = REPO / "tests" / "projects" / "scripts"


def profile_script_on_ranks(project: Path, *script_args: str) -> subprocess.CompletedProcess[str]:
    """`skyline profile train_ddp.py --nproc 2 --json out.json -- ARGS` in `project` (a copy of the
    scripts' project), checked to leave no process of its own behind."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, SKYLINE_TEST_MARKER=marker)
    command = [sys.executable, "-m", "skyline_engine", "profile", "train_ddp.py", "--nproc", "2", "--quiet"]
    command += ["--json", "out.json", "--", *script_args]
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert _processes_with(marker) == []
    return result


@pytest.mark.slow
def test_a_data_parallel_script_runs_on_every_rank_in_step_with_rank_0(tmp_path):
    # The script joins its own process group, wraps its model in DDP, and trains 1,000 epochs: rank
    # 0 measures its iterations while rank 1 runs the same ones, and both stop before the checkpoint.
    project = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, project)
    result = profile_script_on_ranks(project)
    assert result.returncode == 0, result.stderr
    doc = json.loads((project / "out.json").read_text())
    script = project / "train_ddp.py"
    assert doc["batch_size"] == 32 and doc["batch_size_location"]["line"] == marked_line(script, "# BATCH")
    lines = {(line["path"], line["line"]): line for line in doc["lines"]}
    model = lines["model.py", marked_line(project / "model.py", "return self.head")]
    assert model["forward_ms"] > 0 and model["backward_ms"] > 0
    assert lines["train_ddp.py", marked_line(script, "# STEP")]["step_ms"] > 0
    assert doc["iteration"]["repetitions"] >= 3
    assert any(
        w.startswith("Data-parallel training over 2 processes: each batch size is rank 0's") for w in doc["warnings"]
    )
    # Other batch sizes, each a run of the script on both ranks (its process group joined again
    # each time): half and twice the user's, measured, and the models.
    samples = {s["batch_size"]: s for s in doc["models"]["samples"]}
    assert {16, 32, 64} <= set(samples) and doc["models_withheld"] is None
    assert samples[16]["peak_memory_bytes"] < samples[32]["peak_memory_bytes"] < samples[64]["peak_memory_bytes"]
    assert not (project / "checkpoint.pt").exists()


@pytest.mark.slow
def test_a_data_parallel_script_failing_on_one_rank_is_named_at_its_line(tmp_path):
    project = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, project)
    result = profile_script_on_ranks(project, "--fail-on-rank", "1")
    assert result.returncode == 1
    line = marked_line(project / "train_ddp.py", "# FAILS")
    assert result.stderr.startswith(
        f"skyline: error: train_ddp.py:{line}: rank 1 failed: ValueError: rank 1 cannot go on"
    ), result.stderr


@pytest.mark.slow
def test_a_data_parallel_script_under_torchrun_is_profiled_on_its_ranks(tmp_path):
    # torchrun starts the ranks; they find each other through a folder named after the job.
    project = tmp_path / "scripts"
    shutil.copytree(SCRIPTS, project)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += ["-m", "skyline_engine", "profile", "train_ddp.py", "--device", "cpu", "--quiet", "--json", "out.json"]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    doc = json.loads((project / "out.json").read_text())
    assert doc["batch_size"] == 32 and doc["iteration"]["repetitions"] >= 3
    assert any(w.startswith("Data-parallel training over 2 processes") for w in doc["warnings"])
    assert result.stdout.count("Skyline · train_ddp.py") == 1  # rank 0's report only
    assert not (project / "checkpoint.pt").exists()
    assert not list(tmp_path.glob("skyline-ranks-*"))  # the ranks' folder is gone


def profile_failing_ranks(entry: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`skyline profile ENTRY --nproc 2` that must fail, checked to leave no process and no file of
    its own behind (the launcher's error files included)."""
    marker = uuid.uuid4().hex
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = dict(os.environ, SKYLINE_TEST_MARKER=marker, TMPDIR=str(temporary))
    command = [sys.executable, "-m", "skyline_engine", "profile", entry, "--nproc", "2", "--quiet", *options]
    result = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 1
    assert _processes_with(marker) == []
    # torch's compile cache is meant to stay (importing the compiler makes it).
    assert sorted(path.name for path in temporary.iterdir() if not path.name.startswith("torchinductor_")) == []
    return result


@pytest.mark.slow
def test_a_failing_rank_is_named_at_its_line_and_leaves_no_process(tmp_path):
    result = profile_failing_ranks("rank_fails.py", tmp_path)
    first = result.stderr.splitlines()[0]
    assert first.startswith("skyline: error: rank_fails.py:23: rank 1 failed: ValueError: rank one cannot go on")
    assert "Traceback" not in result.stderr  # the launcher's own log is kept quiet


@pytest.mark.slow
def test_an_iteration_that_reaches_into_the_wrapped_model_is_told_why_it_cannot(tmp_path):
    result = profile_failing_ranks("reaches_into_the_model.py", tmp_path)
    first = result.stderr.splitlines()[0]
    assert first.startswith("skyline: error: reaches_into_the_model.py:21: rank ")
    assert "AttributeError: 'DistributedDataParallel' object has no attribute 'inner'" in first
    assert "gets the model wrapped in DistributedDataParallel" in first and "call `model(...)`" in first


@pytest.mark.slow
def test_parameters_that_get_no_gradient_are_named_with_the_wrapping_that_accepts_them(tmp_path):
    # DDP's own message asks for find_unused_parameters=True, which Skyline's wrapping does not
    # take, and numbers the parameters; the advice names them and how to wrap the model instead.
    result = profile_failing_ranks("unused_parameters.py", tmp_path)
    failing = marked_line(PROJECT / "unused_parameters.py", "# FAILS")
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"skyline: error: unused_parameters.py:{failing}: rank ")
    said = " ".join(result.stderr.split())
    assert "some parameters got none (`auxiliary.weight`, `auxiliary.bias`)" in said
    assert "`DistributedDataParallel(model, find_unused_parameters=True)`" in said


@pytest.mark.slow
def test_a_model_the_provider_wraps_itself_is_kept_as_it_is(tmp_path):
    # The advice above, followed: find_unused_parameters=True is the user's, and the analysis runs.
    out = tmp_path / "analysis.json"
    result = run_skyline(
        "profile", "unused_parameters_accepted.py", "--nproc", "2", "--device", "cpu", "--json", out, cwd=PROJECT
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert len(doc["distributed"]["ranks"]) == 2
    # The buckets hold every parameter's gradient, the auxiliary head's (all-reduced as zeros) too.
    assert sum(b["size_bytes"] for b in doc["distributed"]["buckets"]) == GRADIENT_BYTES + 4 * (512 * 2 + 2)


@pytest.mark.slow
def test_a_hanging_rank_is_named_at_the_line_it_was_running_and_leaves_no_process(tmp_path):
    result = profile_failing_ranks("rank_hangs.py", tmp_path, "--collective-timeout", "3")
    assert result.stderr.splitlines() == [
        "skyline: error: rank_hangs.py:24: rank 1 hung: it was still running your code here when the other ranks "
        "gave up waiting for it in a collective (3 s, --collective-timeout)."
    ]


@pytest.mark.slow
def test_a_rank_killed_without_a_word_is_the_one_named(tmp_path):
    # As the kernel's out-of-memory killer ends a rank: the rank that lost its peer is not the cause.
    result = profile_failing_ranks("rank_killed.py", tmp_path)
    assert result.stderr.splitlines() == [
        "skyline: error: rank 1 was killed by SIGKILL without an error of its own (the system may have run out of "
        "memory)."
    ]


@pytest.mark.parametrize(
    ("written", "named"),
    [
        # Stopped by the launcher outside its own code (in a collective, say): rank 1's death is the cause.
        ({"message": "stopped by the launcher after another rank failed", "stopped": True}, "rank 1 was killed"),
        # Stopped while still in its code, the others having waited for it: still less sure than a death.
        ({"message": "it was still running your code here", "hung": True, "path": "a.py", "line": 3}, "rank 1 was"),
        # An error of its own is the cause, whatever happened to the others.
        ({"message": "ValueError: bad", "path": "a.py", "line": 3}, "rank 0 failed: ValueError: bad"),
    ],
)
def test_the_rank_named_is_the_likeliest_cause(tmp_path, written, named):
    # torch's own failure records, as its launcher raises them: rank 1 SIGKILLed, rank 0 ended after.
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from skyline_engine.analysis.launch import _rank_failure

    (tmp_path / "rank0.json").write_text(json.dumps(written))
    failures = {
        1: ProcessFailure(local_rank=1, pid=1, exitcode=-signal.SIGKILL, error_file=str(tmp_path / "none")),
        0: ProcessFailure(local_rank=0, pid=2, exitcode=1, error_file=str(tmp_path / "none")),
    }
    assert _rank_failure(ChildFailedError("rank_main", failures), tmp_path, str(tmp_path)).message.startswith(named)


@pytest.mark.slow
def test_nproc_under_torchrun_is_refused():
    env = dict(os.environ, RANK="0", WORLD_SIZE="1")
    command = [sys.executable, "-m", "skyline_engine", "profile", "entry_point.py", "--nproc", "2"]
    result = subprocess.run(command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1 and "under torchrun, leave it out" in result.stderr


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"SKYLINE_TEST_MARKER={marker}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_port_in_use_is_refused_at_once():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_skyline("profile", "entry_point.py", "--nproc", "2", "--port", port, "--quiet", cwd=PROJECT)
    assert result.returncode == 1
    assert f"port {port} is already in use" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(torch.distributed.is_nccl_available(), reason="this torch build has NCCL")
def test_a_missing_backend_says_so():
    # A CPU build of torch has no NCCL: the ranks say so instead of failing inside the launcher.
    result = run_skyline("profile", "entry_point.py", "--nproc", "2", "--device", "cuda", "--quiet", cwd=PROJECT)
    assert result.returncode == 1
    assert "this PyTorch build has no nccl backend (--device cpu uses gloo)." in result.stderr


def test_ranks_beyond_the_machines_cores_or_memory_are_refused_saying_what_they_need():
    # 64 ranks were accepted on a 2-core machine, ~320 MB each; checked with injected figures.
    from skyline_engine.analysis.launch import RANK_MEMORY_BYTES, ranks_beyond_the_machine

    cores = ranks_beyond_the_machine(3, on_cpu=True, cores=2, available_bytes=64 << 30)
    assert cores is not None and "3 ranks on the CPU need a core each, and this machine has 2" in cores.message
    assert cores.hint == "Use --nproc 2 or fewer, or a GPU per rank."
    memory = ranks_beyond_the_machine(8, on_cpu=False, cores=2, available_bytes=2 << 30)
    assert memory is not None and memory.message.startswith("8 ranks need about 2.5 GiB (320.0 MiB each")
    assert "2.0 GiB of memory is available" in memory.message
    assert ranks_beyond_the_machine(2, on_cpu=True, cores=2, available_bytes=2 * RANK_MEMORY_BYTES) is None


@pytest.mark.slow
def test_more_ranks_than_cores_is_refused_before_any_starts(tmp_path):
    cores = os.cpu_count() or 1
    if cores >= 64:
        pytest.skip("no world size above this machine's cores is within the 64 allowed")
    shutil.copytree(REPO / "examples" / "default", tmp_path / "project")
    result = run_skyline("profile", "entry_point.py", "--nproc", cores + 1, "--device", "cpu", cwd=tmp_path / "project")
    assert result.returncode == 1
    assert f"{cores + 1} ranks on the CPU need a core each, and this machine has {cores}" in result.stderr
    assert "rank 0" not in result.stderr  # refused before the launcher started any
