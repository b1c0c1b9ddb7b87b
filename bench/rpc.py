"""A minimal msgpack-RPC client of `skyline serve --stdio`, for timing the warm engine."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack


class Service:
    def __init__(self, project_root: Path, device: str, environment: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skyline_engine",
                "serve",
                "--stdio",
                "--project-root",
                str(project_root),
                "--device",
                device,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=environment,
        )
        self.events: list[tuple[float, list]] = []  # (arrival time, message)
        self._cond = threading.Condition()
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            data = self.process.stdout.read1(65536)
            if not data:
                return
            unpacker.feed(data)
            for message in unpacker:
                with self._cond:
                    self.events.append((time.perf_counter(), message))
                    self._cond.notify_all()

    def request(self, method: str, params: dict | None = None):
        self._next += 1
        msgid = self._next
        self.process.stdin.write(msgpack.packb([0, msgid, method, [params or {}]], use_bin_type=True))
        self.process.stdin.flush()
        message = self.wait(lambda m: m[0] == 1 and m[1] == msgid)[1]
        if message[2] is not None:
            raise RuntimeError(f"{method}: {message[2]}")
        return message[3]

    def wait(self, predicate, timeout: float = 600.0, since: int = 0) -> tuple[float, list]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for arrived, message in self.events[since:]:
                    if predicate(message):
                        return arrived, message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no such message from the service")
                self._cond.wait(remaining)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)
