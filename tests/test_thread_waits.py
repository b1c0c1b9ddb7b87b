"""CPU threads that wait for a core at every parallel region (measure/thread_waits.py): the
probe's verdict from its times, the recommendation withheld, and the state itself, made for real
in a fresh process by holding its OpenMP threads on one core, found by the probe and reported by a
whole analysis, which advises no batch size from it."""

import json
import os
import subprocess
import sys

import pytest
import torch

from skyline_engine.analysis.fitting import THREADS_WAITED, withheld_where_threads_waited
from skyline_engine.measure.thread_waits import GRAIN, SLICE_WAIT_MS, ThreadWaits, thread_waits, waits_of
from skyline_engine.predict.recommendation import Recommendation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_probes_within_microseconds_are_no_wait():
    assert waits_of([0.008, 0.009, 0.007, 0.012, 4.0], threads=2) is None  # one region descheduled


def test_probes_of_a_slice_each_are_a_wait_named_in_the_warning():
    waits = waits_of([8.0, 7.9, 12.0, 0.01, 8.1], threads=4)
    assert waits is not None and waits.region_ms == 8.0 and waits.threads == 4
    warning = waits.warning()
    assert "Your 4 CPU threads waited for a core" in warning
    assert f"{GRAIN * 4:,} numbers, timed after your iterations, took 8.0 ms" in warning
    assert "OMP_WAIT_POLICY=passive" in warning


def test_the_threshold_is_the_median_of_the_probes():
    at = [SLICE_WAIT_MS] * 3
    assert waits_of(at, threads=2) is not None
    assert waits_of([*at[:1], SLICE_WAIT_MS / 2, SLICE_WAIT_MS / 2], threads=2) is None


def test_nothing_is_probed_on_one_thread_or_a_gpu():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert thread_waits(torch.device("cpu")) is None
    finally:
        torch.set_num_threads(threads)
    assert thread_waits(torch.device("cuda")) is None  # its device's type alone: no GPU is used


def test_a_batch_size_is_not_advised_from_iterations_that_waited():
    advice = Recommendation(512, 9000.0, True, "the fastest measured", 4000.0)
    waited = ThreadWaits(8.0, 2)
    assert withheld_where_threads_waited(advice, None) is advice
    withheld = withheld_where_threads_waited(advice, waited)
    assert withheld is not None and withheld.batch_size is None and withheld.reason == THREADS_WAITED
    none = Recommendation.none("no batch size is faster than yours")
    assert withheld_where_threads_waited(none, waited) is none  # its own reason stands
    assert withheld_where_threads_waited(None, waited) is None


# In a fresh process: OpenMP's threads start across the CPUs (libgomp decides how long they spin
# from what it sees then), and then all of them are held on one core, as the scheduler can leave
# them beside other processes' work.
ON_ONE_CORE = r"""
import json, os, sys
from pathlib import Path
import torch
torch.ones(1 << 17).add_(1.0)
for thread in os.listdir("/proc/self/task"):
    os.sched_setaffinity(int(thread), {min(os.sched_getaffinity(0))})
from skyline_engine.measure.thread_waits import thread_waits
waits = thread_waits(torch.device("cpu"))
sys.path.insert(0, "tests")
from engine_helpers import analysed
document = analysed(Path("examples/default"))
found = {"region_ms": waits and waits.region_ms, "warnings": document["warnings"]}
print(json.dumps({**found, "recommendation": document["models"]["recommendation"]}))
"""


@pytest.mark.slow  # a fresh process and an analysis
@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2 or torch.get_num_threads() < 2,
    reason="threads to hold on one core: two CPUs at least",
)
def test_threads_held_on_one_core_wait_and_the_analysis_says_so_and_advises_nothing():
    # The user's own settings of OpenMP's waiting would change what is measured: the default's.
    settings = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "SKYLINE_SETTLE_RUNTIME")
    env = {name: value for name, value in os.environ.items() if name not in settings}
    done = subprocess.run(
        [sys.executable, "-c", ON_ONE_CORE], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["region_ms"] is not None and found["region_ms"] >= SLICE_WAIT_MS
    waited = [w for w in found["warnings"] if w.startswith("Your ") and "waited for a core" in w]
    assert len(waited) == 1, found["warnings"]
    # Its iterations were mostly waits: larger batch sizes ran many times faster per sample (312 ms
    # an iteration at 128 and at 1,024 samples), which a process whose threads do not wait would
    # not reproduce.
    assert found["recommendation"]["batch_size"] is None
    # On a machine other processes keep busy, the blocks can spread too much to compare batch
    # sizes at all: nothing is advised, for that reason (whichever withholds first says why).
    busy = any(w.startswith("Other processes kept") for w in found["warnings"])
    assert found["recommendation"]["reason"] == THREADS_WAITED or busy, found["recommendation"]
