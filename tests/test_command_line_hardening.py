"""The command line against hostile code and options (#37), each case driving the real command.

Outputs go where they were asked for: the path as given when the command started (user code may
change directory), through a symbolic link as a shell's `>` goes, and through a device or a FIFO,
never replacing them (run as root, `--json /dev/null` had replaced the machine's /dev/null). Option
values are refused at parse time, with one line. The command exits once its work is done, ending
what the user's code left running."""

import contextlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import run_skyline
from engine_helpers import analysed, marked_line

ENTRY_POINT = """import os

import torch


def skyline_model_provider():
    if os.environ.get("SKYLINE_TEST_ELSEWHERE"):
        os.chdir(os.environ["SKYLINE_TEST_ELSEWHERE"])
    return torch.nn.Linear(8, 2)


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def iteration(x):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    return iteration
"""


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "entry_point.py").write_text(ENTRY_POINT)
    return tmp_path


def read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    """A reader on the FIFO at `path` (a writer's open waits for one), collecting what it reads."""
    read: list[bytes] = []

    def drain() -> None:
        with open(path, "rb") as fifo:
            read.append(fifo.read())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    return reader, read


@pytest.mark.slow
def test_json_goes_through_a_fifo_and_a_symbolic_link_and_replaces_neither(project):
    fifo, target, link = project / "fifo", project / "target.json", project / "link.json"
    os.mkfifo(fifo)
    target.write_text("old")
    link.symlink_to(target)
    reader, read = read_fifo(fifo)
    result = run_skyline(
        "profile", "entry_point.py", "--device", "cpu", "--json", "fifo", "--trace", "link.json", cwd=project
    )
    assert result.returncode == 0, result.stderr
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO, not a regular file
    assert json.loads(read[0])["entry_point"] == "entry_point.py"
    assert link.is_symlink() and os.readlink(link) == str(target)  # still the link
    assert "traceEvents" in json.loads(target.read_text())  # the file it points to has the trace


@pytest.mark.slow
def test_an_sqlite_report_is_refused_a_fifo_before_the_analysis(project):
    fifo = project / "fifo"
    os.mkfifo(fifo)
    result = run_skyline("memory", "entry_point.py", "--device", "cpu", "-o", "fifo", cwd=project)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "skyline: error: cannot write --output 'fifo': it is not a regular file. Give a file name."
    )
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.slow
def test_outputs_go_where_the_command_started_though_the_code_changes_directory(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    command = [
        sys.executable,
        "-m",
        "skyline_engine",
        "memory",
        "entry_point.py",
        "--device",
        "cpu",
        "-o",
        "out.sqlite",
    ]
    env = dict(os.environ, SKYLINE_TEST_ELSEWHERE=str(elsewhere))  # the model provider goes there
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    assert (project / "out.sqlite").is_file() and not (elsewhere / "out.sqlite").exists()


@pytest.mark.slow
def test_serve_refuses_a_token_file_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    result = run_skyline("serve", "--listen", "127.0.0.1:0", "--token-file", fifo, cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    assert "cannot write the token file" in result.stderr and "it is not a regular file" in result.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (("profile", "e.py", "--memory-capacity", "9" * 400), "'" + "9" * 400 + "' is more than 1 EiB"),
        (("profile", "e.py", "--port", "99999"), "the port must be at most 65,535, not 99999"),
        (("profile", "e.py", "--collective-timeout", "inf"), "the collective timeout must be from 1 to 86400, not inf"),
        (("profile", "e.py", "--collective-timeout", "1e-9"), "must be from 1 to 86400, not 1e-9"),
        (
            ("profile", "e.py", "--interconnect-gbps", "inf"),
            "the interconnect's bandwidth must be from 0.001 to 100000",
        ),
        (("profile", "e.py", "--interconnect-gbps", "1e-300"), "must be from 0.001 to 100000, not 1e-300"),
        (("profile", "e.py", "--set-batch-size", "1" + "0" * 30), "the batch size must be at most 2,147,483,647"),
        (("serve", "--stdio", "--worker-memory-limit", "9" * 400), "is more than 1 EiB"),
    ],
    ids=["capacity", "port", "timeout-inf", "timeout-tiny", "gbps-inf", "gbps-tiny", "batch-size", "worker-memory"],
)
def test_absurd_option_values_are_one_line_at_parse_time(tmp_path, arguments, said):
    # Refused before anything runs: no traceback, no analysis whose result is lost at the end.
    result = run_skyline(*arguments, cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert said in result.stderr.splitlines()[-1]


LEAVES_A_THREAD_AND_A_PROCESS = ENTRY_POINT.replace(
    "    return torch.nn.Linear(8, 2)",
    """    import subprocess
    import sys
    import threading
    import time

    threading.Thread(target=time.sleep, args=(3600,)).start()  # not a daemon
    marker = os.environ["SKYLINE_TEST_MARKER"]
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(3001)  # {marker}"], start_new_session=True)
    return torch.nn.Linear(8, 2)""",
)


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_the_command_exits_and_ends_what_the_users_code_left_running(project):
    # A non-daemon thread kept `skyline profile` from exiting after its report; a process the code
    # started (in a session of its own) outlived it, holding its output pipes.
    (project / "entry_point.py").write_text(LEAVES_A_THREAD_AND_A_PROCESS)
    marker = uuid.uuid4().hex
    command = [sys.executable, "-m", "skyline_engine", "memory", "entry_point.py", "--device", "cpu", "-o", "m.sqlite"]
    env = dict(os.environ, SKYLINE_TEST_MARKER=marker)
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert (project / "m.sqlite").is_file() and processes_with(marker) == []


@pytest.mark.slow
def test_an_interrupt_raised_by_the_users_code_is_told_at_its_line(project):
    # It printed `skyline: interrupted` alone, as for a Ctrl-C, with nothing to find.
    source = ENTRY_POINT.replace(
        "        model(x).sum().backward()\n", "        raise KeyboardInterrupt  # INTERRUPTS\n"
    )
    (project / "entry_point.py").write_text(source)
    result = run_skyline("profile", "entry_point.py", "--device", "cpu", "--quiet", cwd=project)
    assert result.returncode == 130
    assert result.stderr.splitlines() == [
        f"skyline: interrupted at entry_point.py:{marked_line(source, '# INTERRUPTS')}"
    ]


FROZEN_CLOCK = """
import time

import torch

# What freezegun and some test helpers do: time stands still for the user's code.
time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0
time.monotonic = lambda: 0.0


def skyline_model_provider():
    return torch.nn.Linear(8, 2)


def skyline_input_provider(batch_size=16):
    return (torch.randn(batch_size, 8),)


def skyline_iteration_provider(model):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def iteration(x):
        model(x).pow(2).mean().backward()
        optimizer.step()

    return iteration
"""


@pytest.mark.slow
def test_user_code_that_stops_the_clock_does_not_stop_the_engines(tmp_path, monkeypatch):
    # The engine's clocks were looked up on `time` at each call: a frozen one made every block
    # 0 ms long and the analysis an `internal` ZeroDivisionError.
    for name in ("perf_counter", "perf_counter_ns", "monotonic"):
        monkeypatch.setattr(time, name, getattr(time, name))  # put back after the test
    doc = analysed(tmp_path, "entry_point.py", source=FROZEN_CLOCK, predict=False)
    assert time.perf_counter() == 0.0  # the user's code did replace it
    assert doc["iteration"]["run_time_ms"] > 0 and doc["iteration"]["samples_per_second"] > 0


STARTS_A_BACKGROUND_SLEEP = ENTRY_POINT.replace(
    "    return torch.nn.Linear(8, 2)",
    """    os.system(f"sleep {os.environ['SKYLINE_TEST_MARKER']} &")  # the shell's orphan holds our output
    return torch.nn.Linear(8, 2)""",
)


@pytest.mark.slow
def test_a_ranks_background_process_ends_with_it_and_holds_nothing_up(project):
    # Each rank's `sleep 301 &` held the rank's inherited output, and the launcher waited for it:
    # 63 s for a 61 s sleep. The timeout is a guard against that hang, not a measure of speed.
    (project / "entry_point.py").write_text(STARTS_A_BACKGROUND_SLEEP)
    marker = f"301.{uuid.uuid4().int % 10**9}"
    command = [sys.executable, "-m", "skyline_engine", "profile", "entry_point.py", "--nproc", "2", "--quiet"]
    env = dict(os.environ, SKYLINE_TEST_MARKER=marker)
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout and processes_with(marker) == []


CRASHES_ON_RANK_1 = ENTRY_POINT.replace(
    "    def iteration(x):\n",
    """    def iteration(x):
        if os.environ.get("RANK") == "1":
            import ctypes

            ctypes.string_at(0)  # CRASH: a segfault, as a broken extension makes one
""",
)


@pytest.mark.slow
def test_a_rank_killed_by_a_segfault_is_named_at_the_line_it_was_running(project):
    # "rank 1 was killed by SIGSEGV without an error of its own", though faulthandler had
    # printed the stacks: now the line is read from them.
    (project / "entry_point.py").write_text(CRASHES_ON_RANK_1)
    result = run_skyline("profile", "entry_point.py", "--nproc", "2", cwd=project)
    assert result.returncode == 1
    line = marked_line(CRASHES_ON_RANK_1, "# CRASH")
    assert f"entry_point.py:{line}: rank 1 was killed by SIGSEGV while running this line" in result.stderr
