"""Byte streams to an engine: a `skyline serve --stdio` child process, or a TCP service.

Both offer the same four operations (`read`, `write`, `close`, `describe_end`) to the
connection, which owns the protocol. Opening either can fail in ways the user must hear about
(no such interpreter, connection refused); that is `EngineUnavailable`, with a message for people.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO, Protocol

from .wire import Spec

READ_SIZE = 1 << 16
CONNECT_TIMEOUT_S = 10.0
# After stdin closes the service ends its workers and exits; a stuck one is killed after this.
EXIT_GRACE_S = 5.0
LOG_TAIL_LINES = 20

# rplugin/python3/skyline_rplugin/transport.py → the plugin's root, which holds `skyline_engine`
# when the plugin is a checkout (a plugin manager's clone): the engine then needs no install.
PLUGIN_ROOT = Path(__file__).resolve().parents[3]


class EngineUnavailable(Exception):
    """The engine could not be reached; the message says why, for people."""


class Transport(Protocol):
    """A byte stream to an engine, as the connection uses it."""

    def read(self) -> bytes: ...  # b"" once the stream has ended
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def describe_end(self) -> str: ...  # why the stream ended, for people


def open_transport(spec: Spec) -> Transport:
    remote = spec.get("remote")
    if remote:
        return TcpTransport(remote["host"], int(remote["port"]))
    return StdioTransport(spec)


class StdioTransport:
    def __init__(self, spec: Spec) -> None:
        python = spec.get("python") or sys.executable
        root = spec["project_root"]
        command = [python, "-m", "skyline_engine", "serve", "--stdio", "--project-root", root]
        command += list(spec.get("engine_args") or [])
        self.log_path = Path(spec["log_dir"]) / "engine.log"
        self._tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")  # noqa: SIM115 - the stderr thread owns and closes it
        except OSError as exc:
            raise EngineUnavailable(
                f"cannot write the engine's log {str(self.log_path)!r}: {exc.strerror or exc}."
            ) from None
        try:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=root,
                env=_engine_environment(),
            )
        except OSError as exc:
            log.close()
            raise EngineUnavailable(
                f"cannot start the engine with {python!r}: {exc.strerror or exc}. "
                "Set g:skyline_python (or the `python` option) to a Python that has torch."
            ) from None
        stdin, stdout, stderr = self.process.stdin, self.process.stdout, self.process.stderr
        assert stdin is not None and stdout is not None and stderr is not None  # all three are PIPE above
        self._stdin: IO[bytes] = stdin
        self._stdout: IO[bytes] = stdout
        self._stderr: IO[bytes] = stderr
        self._stderr_done = threading.Thread(
            target=self._drain_stderr, args=(log,), name="skyline-engine-stderr", daemon=True
        )
        self._stderr_done.start()

    def read(self) -> bytes:
        try:
            return os.read(self._stdout.fileno(), READ_SIZE)
        except (OSError, ValueError):
            return b""

    def write(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def close(self) -> None:
        """Close stdin (the service exits on EOF, taking its workers); kill it if it lingers."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        threading.Thread(target=self._reap, name="skyline-engine-reaper", daemon=True).start()

    def describe_end(self) -> str:
        try:
            status = self.process.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            status = None
        self._stderr_done.join(1.0)
        what = "the engine stopped answering" if status is None else f"the engine exited with status {status}"
        last = next((line for line in reversed(self._tail) if line.strip()), "")
        return f"{what}{': ' + last if last else ''} (log: {self.log_path})"

    def _reap(self) -> None:
        try:
            self.process.wait(EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _drain_stderr(self, log: IO[bytes]) -> None:
        # The engine's log (and the user code's prints) must not fill the pipe and stall it.
        with log:
            for raw in iter(self._stderr.readline, b""):
                log.write(raw)
                log.flush()
                self._tail.append(raw.decode("utf-8", "replace").rstrip())
        self._stderr.close()


class TcpTransport:
    def __init__(self, host: str, port: int) -> None:
        self.address = f"{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise EngineUnavailable(f"cannot connect to the engine at {self.address}: {exc.strerror or exc}.") from None
        self.sock.settimeout(None)

    def read(self) -> bytes:
        try:
            return self.sock.recv(READ_SIZE)
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def describe_end(self) -> str:
        return f"the connection to the engine at {self.address} closed"


def _engine_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"  # the log must be complete when the engine dies
    if (PLUGIN_ROOT / "skyline_engine").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGIN_ROOT), env.get("PYTHONPATH")) if p)
    return env
