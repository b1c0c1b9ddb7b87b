"""The service's pool of worker processes, where the user's code runs, one analysis per process
(each runs worker_main.py).

- `WorkerProcess` starts `python -m skyline_engine.service.worker_main` and turns its message stream
  into a queue of checked messages (worker_messages.py: the user's code can write to that stream);
  it forwards the worker's stderr to the service's log, keeping the tail for crash reports.
  Whatever the user's code prints, and however long its lines, what the service holds of it is
  bounded: stderr is read in chunks, the log gets each line cut at MAX_LOG_LINE_BYTES, and the
  tail is the last STDERR_TAIL_BYTES bytes.
- `WorkerPool` keeps one *spare* worker, started ahead with torch imported, so an analysis begins
  at once, and the installed libraries the last analysis imported (measure/import_ahead.py). The
  spare is started only while no analysis runs: importing torch next to a measurement would slow
  the measurement down.
- `Job` follows one analysis in its worker: it forwards progress, partial and final results to a
  listener, enforces the time limit, and turns an unexpected end of the process (crash, signal,
  exit, out-of-memory kill) into an error that says which. One job at a time measures on the
  service's device (`WorkerPool.device_slot`), for all clients: two analyses side by side skew
  each other's times and, on a GPU, run each other out of memory. The slot passes on only once
  the worker that held it is reaped, so a superseded analysis's GPU memory is free again.

A fresh process per analysis is what makes edits to the user's files take effect (nothing stays
imported) and what lets the service survive anything the code does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, Callable, Protocol

import msgpack

import skyline_engine
from skyline_engine import processes
from skyline_engine.entry.user_frames import user_frame_in_faulthandler_dump
from skyline_engine.measure.runtime import settle_runtime
from skyline_engine.service import failures
from skyline_engine.service.config import ServiceConfig
from skyline_engine.service.failures import Failure
from skyline_engine.service.worker_messages import WorkerProtocolError, check_message

log = logging.getLogger("skyline.service")

# The worker's messages carry whole analysis documents: a small GPT's, with each operation of its
# iteration for a trace, is 434 KB, its longest array 1,004 items. Anything larger means a broken
# or forged stream, and is refused before it is decoded: a forged array header of 12 million
# items, decoded under the former 256 MiB cap alone, grew the service from 22 MB to 1.77 GB.
MAX_WORKER_MESSAGE_BYTES = 16 << 20
# The entry points whose last analysis's known memory the service keeps (a worker hands on at most
# a quarter of MAX_WORKER_MESSAGE_BYTES; the transformer example's took 51 KiB, the small GPT's 59).
KNOWN_ENTRY_POINTS = 4
MAX_WORKER_ARRAY_ITEMS = 100_000
MAX_WORKER_MAP_ITEMS = 10_000
MAX_WORKER_STRING_BYTES = 1 << 20
# The end of a worker's stderr kept for its crash report: room for faulthandler's stacks of a
# few dozen threads. Bytes, not lines: one line may be gigabytes long.
STDERR_TAIL_BYTES = 64 << 10
STDERR_READ_BYTES = 64 << 10
# A line of the worker's output longer than this is cut in the service's log.
MAX_LOG_LINE_BYTES = 16 << 10
# How many of the tail's last lines a crash report carries (`details`; Failure caps its size).
DETAILS_LINES = 60
# After asking a worker past its time limit for its stacks, how long to let it write them.
STACK_DUMP_GRACE_S = 1.0
# How long a worker that has sent its last message may take to exit on its own.
EXIT_GRACE_S = 10.0


def _worker_environment(settle: bool = False) -> dict[str, str]:
    # The worker must import this very engine, wherever it is installed (or not installed: a
    # checkout run with `python -m skyline_engine`); its working folder is the user's project.
    # Its runtime is the user's, unless the service was asked to settle it (`settle`).
    env = dict(os.environ)
    package_parent = str(Path(skyline_engine.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"  # the log, and the crash tail, must be complete
    if settle:
        settle_runtime(env)  # measure/runtime.py
    return env


class WorkerProcess:
    def __init__(
        self,
        config: ServiceConfig,
        on_ready: Callable[[WorkerProcess, dict[str, Any]], None],
        import_ahead: tuple[str, ...] = (),
    ) -> None:
        """`import_ahead`: installed modules to import while it waits for its job, the last
        analysis's (measure/import_ahead.py)."""
        command = [sys.executable, "-m", "skyline_engine.service.worker_main", "--device", config.device]
        if config.worker_memory_limit_bytes is not None:
            command += ["--memory-limit", str(config.worker_memory_limit_bytes)]
        if import_ahead:
            command += ["--import-ahead", ",".join(import_ahead)]
        self._on_ready = on_ready
        # Where this machine allows one, a cgroup of its own (processes.py): ending it ends whatever
        # the user's code started, however it left the worker's tree.
        self.cgroup = processes.Cgroup.create(f"{CGROUP_PREFIX}{os.getpid()}-{time.monotonic_ns()}")
        with _workers_lock:  # end_orphans must never take a worker being started for an orphan
            try:
                self.popen = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=str(config.project_root),
                    env=_worker_environment(config.settle_runtime),
                    # Its own process group: stopping the worker also stops what the user's code started
                    # in it (processes.py finds those that left it).
                    start_new_session=True,
                )
            except BaseException:
                if self.cgroup is not None:
                    self.cgroup.remove()
                raise
            _worker_pids.add(self.popen.pid)
        if self.cgroup is not None and not self.cgroup.add(self.popen.pid):  # before any user code runs in it
            self.cgroup.remove()
            self.cgroup = None
        stdin, stdout, stderr = self.popen.stdin, self.popen.stdout, self.popen.stderr
        assert stdin is not None and stdout is not None and stderr is not None  # all three are PIPE above
        self._stdin: IO[bytes] = stdin
        self._stdout: IO[bytes] = stdout
        self._stderr: IO[bytes] = stderr
        self.pid = self.popen.pid
        self.messages: queue.Queue[dict[str, Any] | Garbled | None] = queue.Queue()
        self.ready_message: dict[str, Any] | None = None
        self._started = False  # it has sent `started`
        self.ready = threading.Event()  # set on `ready`, or when the worker ends before it
        self._tail = StderrTail(STDERR_TAIL_BYTES)
        self._stderr_thread = threading.Thread(
            target=self._forward_stderr, name=f"worker-{self.pid}-stderr", daemon=True
        )
        self._stderr_thread.start()
        threading.Thread(target=self._read_messages, name=f"worker-{self.pid}-messages", daemon=True).start()
        log.debug("started worker %d", self.pid)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send_job(self, job: dict[str, Any]) -> None:
        try:
            self._stdin.write(msgpack.packb(job, use_bin_type=True))
            self._stdin.flush()
        except (OSError, ValueError):
            pass  # it has died already: its end is reported from its message stream

    def dump_stacks(self) -> None:
        """Ask faulthandler in the worker to write every thread's stack to stderr."""
        self._signal(signal.SIGUSR1)

    def kill(self) -> None:
        """Kill the worker and every process below it, those in sessions of their own included."""
        cgroup = self.cgroup
        if cgroup is not None:
            cgroup.kill()
        if self.popen.poll() is not None:
            return  # reaped: its pid may belong to someone else by now
        processes.kill_tree(self.pid)
        self._signal(signal.SIGKILL)  # its process group

    def _signal(self, number: int) -> None:
        if self.popen.poll() is not None:
            return  # reaped: its pid (and group id) may belong to someone else by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, number)

    def wait(self, timeout: float | None = None) -> int:
        returncode = self.popen.wait(timeout)
        with _workers_lock:
            _worker_pids.discard(self.pid)
        self._end_cgroup()
        return returncode

    def _end_cgroup(self) -> None:
        """Once the worker is reaped: what the user's code left in its cgroup killed, and the cgroup
        removed (by end_orphans, once those have exited)."""
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None and not cgroup.remove():
            with _workers_lock:
                _cgroups_left.append(cgroup)

    def kill_leftovers(self) -> None:
        """Right after the worker is reaped: end processes the user's code left in its group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)

    def stderr_tail(self, settle_s: float = 1.0) -> list[str]:
        self._stderr_thread.join(settle_s)
        return self._tail.lines()

    def close(self) -> None:
        self.kill()
        with contextlib.suppress(OSError):
            self._stdin.close()

    def _read_messages(self) -> None:
        unpacker = msgpack.Unpacker(
            raw=False,
            strict_map_key=False,
            max_buffer_size=MAX_WORKER_MESSAGE_BYTES,
            max_array_len=MAX_WORKER_ARRAY_ITEMS,
            max_map_len=MAX_WORKER_MAP_ITEMS,
            max_str_len=MAX_WORKER_STRING_BYTES,
            max_bin_len=MAX_WORKER_STRING_BYTES,
            max_ext_len=MAX_WORKER_STRING_BYTES,
        )
        fd = self._stdout.fileno()
        try:
            while True:
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                unpacker.feed(data)
                for message in unpacker:
                    self._accept(check_message(message))
        except WorkerProtocolError as exc:
            self._garbled(str(exc))
        except Exception as exc:  # noqa: BLE001 - undecodable: nothing more from the stream can be trusted
            self._garbled(f"the message stream cannot be decoded: {type(exc).__name__}")
        finally:
            self.ready.set()
            self.messages.put(None)
            self._stdout.close()

    def _garbled(self, detail: str) -> None:
        log.warning("worker %d sent a malformed message (%s): stopping it", self.pid, detail)
        self.messages.put(Garbled(detail))
        self.kill()

    def _accept(self, message: dict[str, Any]) -> None:
        self._check_order(message["type"])
        if message["type"] == "ready":
            self.ready_message = message
            self.ready.set()
            self._on_ready(self, message)
        self.messages.put(message)

    def _check_order(self, kind: str) -> None:
        """The order is part of the protocol: `ready` first and once, then `started` once, then the
        rest. A forged `ready` would change the device every client is told of; a forged `started`
        would restart the time limit."""
        if kind == "ready" or self.ready_message is None:
            if kind != "ready":
                raise WorkerProtocolError(f"`{kind}` before `ready`")
            if self.ready_message is not None:
                raise WorkerProtocolError("a second `ready`")
        elif kind == "started":
            if self._started:
                raise WorkerProtocolError("a second `started`")
            self._started = True
        elif not self._started:
            raise WorkerProtocolError(f"`{kind}` before `started`")

    def _forward_stderr(self) -> None:
        log_lines = LogLines(f"[worker {self.pid}] ", _write_log)
        fd = self._stderr.fileno()
        try:
            while True:
                try:
                    data = os.read(fd, STDERR_READ_BYTES)
                except OSError:
                    break
                if not data:
                    break
                self._tail.add(data)
                log_lines.add(data)
            log_lines.flush()
        finally:
            self._stderr.close()


class StderrTail:
    """The last `limit` bytes of a stream, kept as it arrives."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._data = bytearray()
        self._cut = False  # bytes before the kept ones were dropped
        self._lock = threading.Lock()

    def add(self, data: bytes) -> None:
        with self._lock:
            self._data += data[-self.limit :]
            if len(self._data) > self.limit:
                del self._data[: len(self._data) - self.limit]
                self._cut = True
            elif len(data) > self.limit:
                self._cut = True

    def lines(self) -> list[str]:
        with self._lock:
            data, cut = bytes(self._data), self._cut
        lines = data.decode("utf-8", "replace").split("\n")
        if cut:
            lines[0] = "…" + lines[0]  # the end of a line whose start was dropped
        if lines and not lines[-1]:
            lines.pop()
        return lines


class LogLines:
    """Output written to the log a line at a time, each with a prefix; a line longer than
    MAX_LOG_LINE_BYTES is cut there (the rest of it is skipped), so no line is held whole."""

    def __init__(self, prefix: str, write: Callable[[str], None]) -> None:
        self._prefix = prefix
        self._write = write
        self._line = bytearray()
        self._cut = False

    def add(self, data: bytes) -> None:
        pieces = data.split(b"\n")
        for piece in pieces[:-1]:
            self._extend(piece)
            self._end_line()
        self._extend(pieces[-1])

    def flush(self) -> None:
        if self._line or self._cut:
            self._end_line()

    def _extend(self, piece: bytes) -> None:
        room = MAX_LOG_LINE_BYTES - len(self._line)
        if len(piece) > room:
            self._cut = True
        if room > 0:
            self._line += piece[:room]

    def _end_line(self) -> None:
        text = self._line.decode("utf-8", "replace")
        if self._cut:
            text += f" [… the rest of this line is not logged: it is longer than {MAX_LOG_LINE_BYTES} bytes]"
        self._write(self._prefix + text + "\n")
        self._line.clear()
        self._cut = False


def _write_log(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# Workers started and not yet reaped: the service's children that are not orphans.
_workers_lock = threading.Lock()
_worker_pids: set[int] = set()
# A worker's cgroup is named this, then the service's process id (processes.remove_stale_cgroups).
CGROUP_PREFIX = "skyline-worker-"
# Workers' cgroups whose processes had not all exited when their worker was reaped: removed later.
_cgroups_left: list[processes.Cgroup] = []


def end_orphans() -> None:
    """End the processes re-parented to the service (a subreaper) because the worker above them
    died without ending them (a crash, the out-of-memory killer, a fork chain that outran the
    worker's own kills), and reap those that ended. Listed under the lock, so that a worker being
    started is never taken for one; ended outside it, so that starting workers never waits on
    kills (an orphan's pid cannot be reused before the service reaps it)."""
    with _workers_lock:
        orphans = [pid for pid in processes.own_children() if pid not in _worker_pids]
        _cgroups_left[:] = [cgroup for cgroup in _cgroups_left if not cgroup.remove()]
    if orphans:
        processes.end_orphans(orphans)
        log.info("ended %d processes a worker left behind: %s", len(orphans), ", ".join(map(str, orphans[:20])))


@dataclass(frozen=True)
class Garbled:
    """In a worker's message queue: its stream broke the rules (worker_messages.py); it is stopped."""

    detail: str


class WorkerPool:
    """Hands out workers, keeping one spare warm while no analysis runs."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._spare: WorkerProcess | None = None
        self._running = 0
        self._closed = False
        # Held by the job whose worker measures, from sending the job until that worker is reaped.
        self.device_slot = threading.Lock()
        self._device: dict[str, Any] | None = None
        self._device_error: str | None = None
        self._device_known = threading.Event()
        # The installed modules the last complete analysis imported: the next spare imports them
        # while it waits (measure/import_ahead.py).
        self._import_ahead: tuple[str, ...] = ()
        # What the last complete analysis of each entry point measured of the memory (the worker's
        # `known_memory`), for the next analysis of it to take from where its code is unchanged
        # (analysis/known_memory.py); the last KNOWN_ENTRY_POINTS entry points', oldest first.
        self._known_memory: dict[str, dict[str, Any]] = {}

    def imported(self, modules: list[str]) -> None:
        """A complete analysis's installed modules (the worker's `imports`), for the next spare."""
        self._import_ahead = tuple(modules)

    def known_memory(self, entry_point: str) -> dict[str, Any] | None:
        """What the last complete analysis of `entry_point` handed on, if any."""
        with self._lock:
            return self._known_memory.get(entry_point)

    def measured(self, entry_point: str, known_memory: dict[str, Any] | None) -> None:
        """A complete analysis's `known_memory`, kept for the next analysis of `entry_point` (none
        kept where it handed none on)."""
        with self._lock:
            self._known_memory.pop(entry_point, None)
            if known_memory is not None:
                self._known_memory[entry_point] = known_memory
            while len(self._known_memory) > KNOWN_ENTRY_POINTS:
                del self._known_memory[next(iter(self._known_memory))]

    def start_spare(self) -> None:
        with self._lock:
            if self._closed or self._running or (self._spare is not None and self._spare.alive()):
                return
            self._spare = self._spawn()

    @property
    def closed(self) -> bool:
        return self._closed

    def take(self) -> WorkerProcess | None:
        """A worker for a new analysis (the spare when it is alive), or None once closed."""
        with self._lock:
            if self._closed:
                return None
            worker, self._spare = self._spare, None
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.close()
                worker = self._spawn()  # may raise (no more processes): then nothing is counted
            self._running += 1
            return worker

    def release(self) -> None:
        """An analysis ended: once none runs, warm up the next spare."""
        with self._lock:
            self._running -= 1
        self.start_spare()

    def spare_pid(self) -> int | None:
        spare = self._spare
        return spare.pid if spare is not None and spare.alive() else None

    def device(self, timeout: float) -> tuple[dict[str, Any] | None, str | None]:
        """The analysis device as a worker describes it ({..} or None, and why not)."""
        self.start_spare()
        if not self._device_known.wait(timeout):
            return None, f"no analysis worker reported its device within {timeout:g} s"
        return self._device, self._device_error

    def close(self) -> None:
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                spare.wait(EXIT_GRACE_S)

    def _spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self.config, self._record_device, self._import_ahead)
        threading.Thread(target=self._watch_start, args=(worker,), name="worker-start", daemon=True).start()
        return worker

    def _record_device(self, worker: WorkerProcess, ready: dict[str, Any]) -> None:
        if ready.get("device") is not None:
            self._device, self._device_error = ready["device"], None
        elif self._device is None:
            error = ready.get("error") or {}
            self._device_error = error.get("message") or "the analysis worker could not start"
        self._device_known.set()

    def _watch_start(self, worker: WorkerProcess) -> None:
        # A worker that dies before `ready` (a broken torch, a memory limit too low to import it)
        # must not leave `initialize` waiting for a device forever.
        started = worker.ready.wait(self.config.worker_start_timeout_s) and worker.ready_message is not None
        if not started and self._device is None:
            self._device_error = "the analysis worker ended before it was ready; see the engine's log"
            self._device_known.set()


class JobListener(Protocol):
    def on_progress(self, job: Job, phase: str, fraction: float) -> None: ...
    def on_partial(self, job: Job, document: dict[str, Any]) -> None: ...
    def on_result(self, job: Job, document: dict[str, Any]) -> None: ...
    def on_error(self, job: Job, failure: Failure) -> None: ...


class Job:
    """One analysis in one worker, from the job sent to the worker's end.

    Its thread reads the worker's messages and forwards them to the listener, while watching two
    deadlines: the worker must start the job within `worker_start_timeout_s`, and finish it within
    the time limit. A worker past a deadline is first asked for its stacks (they say where it was
    stuck), then killed. When the worker ends without a result, the listener gets an error that
    says why.
    """

    def __init__(
        self,
        analysis_id: int,
        request: dict[str, Any],
        pool: WorkerPool,
        listener: JobListener,
        time_limit_s: float,
    ) -> None:
        self.analysis_id = analysis_id
        self.request = request
        # Taken from the pool once the job holds the device: six clients waiting had started six
        # workers (torch imported in each: 1.8 GB), and on CUDA a waiting worker's context would
        # shrink the memory the measuring one sees.
        self._worker: WorkerProcess | None = None
        self.pool = pool
        self.listener = listener
        self.time_limit_s = time_limit_s
        self.last_phase: str | None = None
        self.stopped = False  # cancelled or superseded: nothing more is reported
        self._started = False  # the worker has taken the job
        self._finished = False  # the worker has sent its result or error
        self._overdue: str | None = None  # "time_limit" or "start_timeout", once past the deadline
        self._garbled: str | None = None
        self._deadline = float("inf")
        self._thread = threading.Thread(target=self._run, name=f"analysis-{analysis_id}", daemon=True)

    @property
    def worker(self) -> WorkerProcess:
        assert self._worker is not None, "the job has no worker before it holds the device"
        return self._worker

    @property
    def worker_pid(self) -> int | None:
        """The worker's process id; None while the job waits for the device (it has none yet)."""
        return self._worker.pid if self._worker is not None else None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Cancel: the worker is killed at once (user code cannot be interrupted politely)."""
        self.stopped = True
        if self._worker is not None:
            self._worker.kill()

    def _run(self) -> None:
        holding = False
        try:
            holding = self._take_the_device()
            if holding:
                self._worker = self.pool.take()
                if self._worker is None:  # the service is shutting down
                    return
                if self.stopped:  # cancelled while the worker was taken: stop() saw none to kill
                    self._worker.kill()
                # Read now, once the analysis before has ended: it holds the device until then.
                known = self.pool.known_memory(str(self.request.get("entry_point")))
                self.worker.send_job({**self.request, "known_memory": known})
                self._follow()
        except Exception:  # a bug here must not leave the worker running (or a zombie) or the pool short
            log.exception("analysis %d: following the worker failed", self.analysis_id)
            if self._worker is not None:
                self._worker.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._worker.wait(EXIT_GRACE_S)
            self.listener.on_error(self, Failure("internal", "internal error in the engine service; see its log."))
        finally:
            if self._worker is not None:
                self._worker.close()
                # Reaped (by _follow, normally) before the next analysis measures: a kill that had not
                # landed yet when close() polled it left a zombie for the service's life (the fuzz
                # tests found one).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._worker.wait(EXIT_GRACE_S)
            if holding:
                self.pool.device_slot.release()
            if self._worker is not None:
                self.pool.release()

    def _take_the_device(self) -> bool:
        """Wait until no other analysis measures on the device; False when stopped meanwhile."""
        if self.pool.device_slot.acquire(blocking=False):
            return True
        self.listener.on_progress(self, "waiting for the device: another analysis is measuring on it", 0.0)
        while not self.stopped:
            if self.pool.device_slot.acquire(timeout=0.1):
                if self.stopped:
                    self.pool.device_slot.release()
                    return False
                return True
        return False

    def _follow(self) -> None:
        oom_kills_before = failures.oom_kill_count()
        self._deadline = time.monotonic() + self.pool.config.worker_start_timeout_s
        while True:
            message = self._next_message()
            if message is None:
                break
            if self._overdue is None and not self._finished:
                self._handle(message)
        returncode = self._reap()
        if not (self._finished or self.stopped):
            self.listener.on_error(self, self._death(returncode, oom_kills_before))

    def _next_message(self) -> dict[str, Any] | Garbled | None:
        """The worker's next message (None once it has ended), keeping the deadlines meanwhile."""
        while True:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                self._deadline_passed()
                continue
            try:
                return self.worker.messages.get(timeout=min(remaining, 3600.0))
            except queue.Empty:
                continue

    def _deadline_passed(self) -> None:
        if self._overdue is None and not self._finished:
            self._overdue = "time_limit" if self._started else "start_timeout"
            self.worker.dump_stacks()
            self._deadline = time.monotonic() + STACK_DUMP_GRACE_S
        else:
            self.worker.kill()
            self._deadline = float("inf")

    def _handle(self, message: dict[str, Any] | Garbled) -> None:
        """Act on a message (checked by worker_messages.check_message) or a broken stream."""
        if isinstance(message, Garbled):
            self._garbled = message.detail
            return
        kind = message["type"]
        if kind == "started":
            self._started = True
            self._deadline = time.monotonic() + self.time_limit_s
        elif kind == "progress":
            self.last_phase = message["phase"]
            self.listener.on_progress(self, message["phase"], float(message["fraction"]))
        elif kind == "partial":
            self.listener.on_partial(self, message["document"])
        elif kind in ("result", "error"):
            self._finished = True
            self._deadline = time.monotonic() + EXIT_GRACE_S  # it exits by itself, or is killed then
            if kind == "result":
                self.pool.imported(message.get("imports", []))  # before release() starts the next spare
                self.pool.measured(str(self.request.get("entry_point")), message.get("known_memory"))
                self.listener.on_result(self, message["document"])
            else:
                self.listener.on_error(self, Failure.from_dict(message))

    def _reap(self) -> int:
        try:
            returncode = self.worker.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            returncode = self.worker.wait()
        self.worker.kill_leftovers()
        end_orphans()
        return returncode

    def _death(self, returncode: int, oom_kills_before: int | None) -> Failure:
        if self._overdue == "start_timeout":
            return failures.start_timeout_error(self.pool.config.worker_start_timeout_s)
        if self._overdue == "time_limit":
            error = failures.time_limit_error(self.time_limit_s, self.last_phase)
        elif self._garbled is not None:
            error = failures.garbled_error(self._garbled)
        else:
            oom_kills_after = failures.oom_kill_count()
            oom_killed = (
                oom_kills_before is not None and oom_kills_after is not None and oom_kills_after > oom_kills_before
            )
            error = failures.death_error(returncode, oom_killed=oom_killed, last_phase=self.last_phase)
        tail = self.worker.stderr_tail()
        path, line = user_frame_in_faulthandler_dump(tail, str(self.pool.config.project_root))
        if path is not None and line is not None:
            error = error.at(path, line)
        return replace(error, details="\n".join(tail[-DETAILS_LINES:]) or None)
