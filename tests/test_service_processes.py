"""Processes the user's code starts end with its analysis, even those that leave the worker's
process group: one in a session of its own (`start_new_session=True`), and an orphan whose parent
exited at once, as daemons do. Whether the analysis completes, is cancelled, its worker dies on
its own, or the service itself is killed.

The real service (stdio); the `escapes` entry point starts `sleep 1000` both ways and writes their
process ids next to itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service_client import WAIT_S, ServiceProcess, copy_project, process_gone, zombie_children
from skyline_engine import processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # the service

ESCAPES = "escapes/entry_point.py"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("processes"))


@pytest.fixture(scope="module")
def service(root):
    service = ServiceProcess(root, "--quick")
    service.client = service.stdio_client()
    service.client.initialize()
    yield service
    service.stop()


@pytest.fixture
def escapes(root):
    """The entry point's folder, cleared; whatever it started is killed after the test."""
    folder = root / "escapes"
    for name in ("pids", "hold", "crash"):
        (folder / name).unlink(missing_ok=True)
    yield folder
    if (folder / "pids").exists():
        for pid in started(folder):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def started(folder) -> list[int]:
    deadline = time.monotonic() + WAIT_S
    while not (folder / "pids").exists():
        assert time.monotonic() < deadline, "the entry point started nothing"
        time.sleep(0.05)
    pids = [int(pid) for pid in (folder / "pids").read_text().split()]
    assert len(pids) == 2
    return pids


def test_they_end_with_a_complete_analysis(client, escapes):
    _, method, final = client.analyze(ESCAPES)
    assert method == "analysis", final
    assert all(process_gone(pid, 30) for pid in started(escapes))


def test_they_end_with_a_cancelled_analysis(client, escapes):
    (escapes / "hold").touch()
    analysis_id = client.request("analyze", {"entry_point": ESCAPES})["analysis_id"]
    pids = started(escapes)
    assert all(not process_gone(pid, 0) for pid in pids)  # running while the analysis runs
    assert client.request("cancel", {"analysis_id": analysis_id}) == {"cancelled": True}
    assert client.wait_final(analysis_id)[1]["kind"] == "cancelled"
    assert all(process_gone(pid, 30) for pid in pids)


def test_they_end_when_their_worker_dies_on_its_own(client, escapes):
    (escapes / "crash").touch()
    _, method, error = client.analyze(ESCAPES)
    assert (method, error["signal"]) == ("analysis_error", "SIGKILL")
    assert all(process_gone(pid, 30) for pid in started(escapes))


@pytest.mark.timeout(120)
def test_they_end_when_the_service_is_killed(root, escapes):
    service = ServiceProcess(root, "--quick")
    try:
        client = service.stdio_client()
        client.initialize()
        (escapes / "hold").touch()
        client.request("analyze", {"entry_point": ESCAPES})
        pids = started(escapes)
        service.proc.kill()  # no chance to clean up: its workers see their stdin close
        assert all(process_gone(pid, 30) for pid in pids)
    finally:
        service.stop()
    if cgroups_here():  # its workers' cgroups stay, until the next service starts
        folder = Path(processes.own_cgroup_folder() or "")
        assert list(folder.glob(f"skyline-worker-{service.proc.pid}-*"))
        fresh = ServiceProcess(root, "--quick")
        try:
            fresh.stdio_client().initialize()  # it has started
        finally:
            fresh.stop()
        assert list(folder.glob(f"skyline-worker-{service.proc.pid}-*")) == []


# Capped (FORKS): a service that cannot stop it must still not fill the machine's process table.
FORK_CHAIN = """
import os
os.setsid()
for _ in range(20000):  # FORKS
    if os.fork():
        os._exit(0)
"""


def starting_a_fork_chain(tiny_entry_point: str, marker: str) -> str:
    """The tiny entry point, its model provider first starting a fork chain in a session of its
    own, as hostile code starts one; `marker` in the chain's command line."""
    start = f"    import subprocess, sys\n    subprocess.Popen([sys.executable, '-c', {FORK_CHAIN!r}, {marker!r}])\n"
    provider = "def skyline_model_provider():\n"
    assert provider in tiny_entry_point
    return tiny_entry_point.replace(provider, provider + start)


def with_marker(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            ours = entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes()
            if ours and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
    return found


# Each link forks the next, leaves for a session of its own and exits: kills by process and by
# group find each link gone and the next one elsewhere (they caught it, in rounds of /proc scans,
# at this speed; the cgroup ends it whatever its speed). It writes its cgroup to a file, and
# stops by itself after 60 s, so that a service that cannot end it leaves nothing for long.
SESSION_CHAIN = """
import os, sys, time
with open(sys.argv[1] + ".cgroup", "w") as f:
    f.write(open("/proc/self/cgroup").read())
end = time.monotonic() + 60
while time.monotonic() < end:
    if os.fork():
        os._exit(0)
    os.setsid()
"""


def cgroups_here() -> bool:
    """Whether this machine lets a process make cgroups below its own (processes.Cgroup)."""
    probe = processes.Cgroup.create(f"skyline-probe-{os.getpid()}")
    return probe is not None and probe.remove()


@pytest.mark.skipif(not cgroups_here(), reason="no writable cgroup v2 here: the service ends processes by group")
def test_a_chain_that_leaves_its_session_at_every_link_ends_with_its_workers_cgroup(root, service):
    marker = f"skyline-session-chain-{os.getpid()}-{time.monotonic_ns()}"
    (root / "sessions").mkdir(exist_ok=True)
    tiny = (root / "tiny" / "entry_point.py").read_text()
    where = root / "sessions" / "where"
    chain = starting_a_fork_chain(tiny, marker).replace(repr(FORK_CHAIN), repr(SESSION_CHAIN))
    chain = chain.replace(f"{marker!r}])", f"{str(where)!r}, {marker!r}])")
    assert repr(SESSION_CHAIN) in chain and str(where) in chain
    (root / "sessions" / "entry_point.py").write_text(chain)
    (root / "sessions" / "model.py").write_text((root / "tiny" / "model.py").read_text())
    _, method, final = service.client.analyze("sessions/entry_point.py")
    assert method == "analysis", final
    folder = Path(processes.own_cgroup_folder() or "")

    def ended_cgroups() -> set[str]:  # of workers that have ended (a worker being started has one a moment)
        cgroups = folder.glob(f"skyline-worker-{service.proc.pid}-*")
        return {c.name for c in cgroups if "populated 0" in (c / "cgroup.events").read_text()}

    deadline = time.monotonic() + WAIT_S
    while True:
        before = ended_cgroups()
        time.sleep(0.2)
        links, stayed = with_marker(marker), before & ended_cgroups()
        if not (links or stayed) or time.monotonic() > deadline:
            break
    assert links == [] and stayed == set()
    # It ran in the worker's cgroup, which ended it.
    assert f"/skyline-worker-{service.proc.pid}-" in (root / "sessions" / "where.cgroup").read_text()


def test_a_fork_chain_is_ended_as_a_group_and_leaves_no_zombies(root, service):
    # Each link forks the next and exits, a hundred microseconds apart: kills by process id missed
    # it, it ran on after the final notification, and ~2,450 zombies gathered under the service,
    # whose next answer took 95 s. Its process group is killed whole, and orphans are reaped as
    # they come.
    marker = f"skyline-fork-chain-{os.getpid()}-{time.monotonic_ns()}"
    (root / "forks").mkdir(exist_ok=True)
    tiny = (root / "tiny" / "entry_point.py").read_text()
    (root / "forks" / "entry_point.py").write_text(starting_a_fork_chain(tiny, marker))
    (root / "forks" / "model.py").write_text((root / "tiny" / "model.py").read_text())
    _, method, final = service.client.analyze("forks/entry_point.py")
    assert method == "analysis", final
    deadline = time.monotonic() + WAIT_S
    while (with_marker(marker) or zombie_children(service.proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert with_marker(marker) == [] and zombie_children(service.proc.pid) == []
    assert service.client.request("status")["latest_complete_analysis_id"] is not None  # it answers at once


# A process that leads a group of its own starts two sleepers in it and exits: both come to this
# subreaper, their group's leader gone. Only one of them is ended as an orphan.
GROUP_WITHOUT_ITS_LEADER = r"""
import json, os, subprocess, sys, time
from skyline_engine.processes import become_subreaper, end_orphans, own_children
assert become_subreaper()
sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
leads = "import subprocess, sys; s = [subprocess.Popen(%r) for _ in range(2)]; print(s[0].pid, s[1].pid)" % (sleeper,)
leader = subprocess.Popen([sys.executable, "-c", leads], start_new_session=True, stdout=subprocess.PIPE, text=True)
ended, kept = map(int, leader.stdout.readline().split())
leader.wait()
deadline = time.monotonic() + 30
while not {ended, kept} <= set(own_children()) and time.monotonic() < deadline:
    time.sleep(0.01)
end_orphans([ended])
time.sleep(0.5)
state = open(f"/proc/{kept}/stat").read().rsplit(")", 1)[1].split()[0]
print(json.dumps({"ended_reaped": not os.path.exists(f"/proc/{ended}"), "kept_state": state}))
os.kill(kept, 9)
os.waitpid(kept, 0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper is Linux's")
def test_an_orphans_group_is_killed_by_its_id_only_where_the_orphan_leads_it():
    # A group whose leader is gone can be free again by the time it is killed, its id taken by
    # another process (a spare worker the service started meanwhile, when a fork chain had cycled
    # through the pids): only a group the orphan leads, which keeps its id while unreaped, is.
    done = subprocess.run(
        [sys.executable, "-c", GROUP_WITHOUT_ITS_LEADER],
        check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["ended_reaped"] and found["kept_state"] in ("S", "R")
