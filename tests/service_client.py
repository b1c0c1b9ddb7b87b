"""A small msgpack-RPC client for the engine service's tests, and the real service as a subprocess.

`ServiceProcess` runs `python -m skyline_engine serve ...` exactly as the editor (stdio) or a user
on a remote machine (TCP) would; `RpcClient` talks to it over any byte stream, collecting
responses by msgid and notifications in arrival order.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgpack

HERE = Path(__file__).resolve().parent
ENTRY_POINTS = HERE / "service_entry_points"
REPO = HERE.parent
WAIT_S = 90.0  # generous: workers import torch, CI machines are slow; tests never assert on time


def is_final(method: str, params: dict) -> bool:
    """Whether a notification ends its analysis: a complete `analysis`, or `analysis_error`."""
    return method == "analysis_error" or (method == "analysis" and not params["partial"])


class RpcError(Exception):
    def __init__(self, error: Any) -> None:
        super().__init__(repr(error))
        self.error = error
        self.code = error.get("code") if isinstance(error, dict) else None


class RpcClient:
    def __init__(self, read: Callable[[], bytes], write: Callable[[bytes], None], close: Callable[[], None]) -> None:
        self._read = read
        self._write = write
        self._close = close
        self._cond = threading.Condition()
        self._responses: dict = {}
        self.notifications: list[tuple[str, dict]] = []
        self.other: list[Any] = []  # anything that is neither response nor notification
        self.closed = False
        self._next_id = 0
        threading.Thread(target=self._reader, daemon=True).start()

    # --- sending ---

    def send_raw(self, data: bytes) -> None:
        self._write(data)

    def send(self, message: Any) -> None:
        self._write(msgpack.packb(message, use_bin_type=True))

    def call(self, method: str, params: dict | None = None, timeout: float = WAIT_S) -> tuple[Any, Any]:
        """(error, result) of a request."""
        with self._cond:
            self._next_id += 1
            msgid = self._next_id
        self.send([0, msgid, method, [params or {}]])
        return self.wait_response(msgid, timeout)

    def request(self, method: str, params: dict | None = None, timeout: float = WAIT_S) -> Any:
        error, result = self.call(method, params, timeout)
        if error is not None:
            raise RpcError(error)
        return result

    def wait_response(self, msgid: int, timeout: float = WAIT_S) -> tuple[Any, Any]:
        with self._cond:
            if not self._cond.wait_for(lambda: msgid in self._responses or self.closed, timeout):
                raise TimeoutError(f"no response to request {msgid}")
            if msgid not in self._responses:
                raise ConnectionError(f"the connection closed before the response to {msgid}")
            return self._responses.pop(msgid)

    def initialize(self, **params) -> dict:
        return self.request("initialize", {"protocol_version": 1, **params})

    # --- notifications ---

    def wait_notification(self, predicate: Callable[[str, dict], bool], timeout: float = WAIT_S) -> tuple[str, dict]:
        start = 0
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for method, params in self.notifications[start:]:
                    if predicate(method, params):
                        return method, params
                start = len(self.notifications)
                remaining = deadline - time.monotonic()
                if self.closed or remaining <= 0:
                    raise TimeoutError(f"no matching notification; got {[m for m, _ in self.notifications]}")
                self._cond.wait(remaining)

    def wait_final(self, analysis_id: int, timeout: float = WAIT_S) -> tuple[str, dict]:
        """The notification that ends an analysis: complete `analysis` or `analysis_error`."""
        return self.wait_notification(lambda m, p: p.get("analysis_id") == analysis_id and is_final(m, p), timeout)

    def about(self, analysis_id: int) -> list[tuple[str, dict]]:
        with self._cond:
            return [(m, p) for m, p in self.notifications if p.get("analysis_id") == analysis_id]

    def analyze(self, entry_point: str, timeout: float = WAIT_S, **params) -> tuple[int, str, dict]:
        """Run one analysis to its end: (analysis_id, final method, final params)."""
        analysis_id = self.request("analyze", {"entry_point": entry_point, **params})["analysis_id"]
        method, final = self.wait_final(analysis_id, timeout)
        return analysis_id, method, final

    def wait_closed(self, timeout: float = WAIT_S) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.closed, timeout)

    def close(self) -> None:
        self._close()

    def _reader(self) -> None:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 30)
        try:
            while True:
                data = self._read()
                if not data:
                    break
                unpacker.feed(data)
                for message in unpacker:
                    self._accept(message)
        except (OSError, ValueError):
            pass
        finally:
            with self._cond:
                self.closed = True
                self._cond.notify_all()

    def _accept(self, message: Any) -> None:
        with self._cond:
            if isinstance(message, list) and len(message) == 4 and message[0] == 1:
                self._responses[message[1]] = (message[2], message[3])
            elif isinstance(message, list) and len(message) == 3 and message[0] == 2:
                params = message[2][0] if message[2] else {}
                self.notifications.append((message[1], params))
            else:
                self.other.append(message)
            self._cond.notify_all()


class ServiceProcess:
    """The real service in a subprocess; stderr goes to a file (its log) that tests may read."""

    def __init__(
        self,
        root: Path,
        *args: str,
        stdio: bool = True,
        listen: str = "127.0.0.1:0",
        token_file: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.log_path = self.root.parent / f"service-{os.getpid()}-{id(self)}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the service writes it until close()
        command = [
            sys.executable,
            "-m",
            "skyline_engine",
            "serve",
            "--project-root",
            str(root),
            "--device",
            "cpu",
            *args,
        ]
        if stdio:
            command.append("--stdio")
        else:
            command += ["--listen", listen]
            if token_file is not None:
                command += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=str(root),
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.host: str | None = None
        self.port: int | None = None
        self.token: str | None = None
        if not stdio:
            self._read_banner()

    def _read_banner(self) -> None:
        for _ in range(2):
            line = self.proc.stdout.readline().decode()
            listening = re.search(r"listening on (\S+):(\d+)", line)
            token = re.search(r"token (\S+)", line)
            if listening:
                self.host, self.port = listening.group(1).strip("[]"), int(listening.group(2))
            if token:
                self.token = token.group(1)
        if self.port is None:
            raise RuntimeError("the service did not say where it listens:\n" + self.log())

    def stdio_client(self) -> RpcClient:
        out = self.proc.stdout.fileno()

        def write(data: bytes) -> None:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

        return RpcClient(lambda: os.read(out, 65536), write, self.proc.stdin.close)

    def tcp_client(self) -> RpcClient:
        sock = socket.create_connection((self.host, self.port), timeout=WAIT_S)
        sock.settimeout(None)

        def read() -> bytes:
            try:
                return sock.recv(65536)
            except OSError:
                return b""

        def close() -> None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

        client = RpcClient(read, sock.sendall, close)
        client.sock = sock
        return client

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def copy_project(destination: Path) -> Path:
    """The entry points, copied to a project root the test may edit."""
    root = Path(destination) / "project"
    shutil.copytree(ENTRY_POINTS, root)
    return root


def children_of(pid: int) -> list[int]:
    """Process ids whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def process_gone(pid: int, timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                return True  # dead, not yet reaped by its parent
        except OSError:
            return True
        time.sleep(0.05)
    return False


def process_reaped(pid: int, timeout: float = WAIT_S) -> bool:
    """Whether `pid` is gone and reaped by its parent (a zombie is not), within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.05)
    return False


def deeply_nested(depth: int) -> bytes:
    """[[[…[nil]…]]] as msgpack: `depth` arrays around a nil, one byte each."""
    return b"\x91" * depth + b"\xc0"


def request_with_deep_params(msgid: int, depth: int) -> bytes:
    """A `status` request whose params hold a value nested `depth` deep."""
    head = msgpack.packb(0) + msgpack.packb(msgid) + msgpack.packb("status")
    return b"\x94" + head + b"\x91" + deeply_nested(depth)


def zombie_children(pid: int) -> list[int]:
    """Children of `pid` that have ended and not been reaped."""
    zombies = []
    for child in children_of(pid):
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    zombies.append(child)
        except OSError:
            continue
    return zombies
