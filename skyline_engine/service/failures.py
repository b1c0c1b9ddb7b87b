"""Why an analysis ended without a result, in words a user can act on: `Failure`, the one shape
of every `analysis_error` (docs/protocol.md), whoever finds the failure.

When the worker itself cannot say (it crashed), the service only sees the end of the process: its
exit status or signal, whether the kernel's out-of-memory killer fired meanwhile, and the tail of
its stderr, where Python's faulthandler has written the stacks (on a crash, or when the service
asked for them before stopping a worker that ran out of time). The innermost frame of the user's
code in those stacks gives the error its line.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace
from typing import Any

# What an `analysis_error` may carry at most, whatever the worker (the user's code) printed or
# raised: the start of the message, the end of the details (the last words are the telling ones).
MAX_MESSAGE_CHARS = 8 << 10
MAX_DETAILS_CHARS = 16 << 10


@dataclass(frozen=True)
class Failure:
    """The fields of an `analysis_error` notification, less its `analysis_id`.

    `message` is one paragraph for people, starting with `path:line: ` when there is a line.
    """

    kind: str
    message: str
    path: str | None = None
    line: int | None = None
    signal: str | None = None  # the signal that ended the worker (`crashed`)
    exit_status: int | None = None  # the status the worker exited with (`crashed`)
    details: str | None = None  # for the log: a traceback, the worker's last words

    def at(self, path: str, line: int) -> Failure:
        """The failure located at the user's `path:line`, said first, as the engine's errors are."""
        return replace(self, path=path, line=line, message=f"{path}:{line}: {self.message}")

    def to_dict(self) -> dict[str, Any]:
        """The wire form, its texts capped (MAX_MESSAGE_CHARS, MAX_DETAILS_CHARS)."""
        fields: dict[str, Any] = {
            "kind": self.kind,
            "message": _keep_start(self.message, MAX_MESSAGE_CHARS),
            "path": self.path,
            "line": self.line,
        }
        if self.signal is not None:
            fields["signal"] = self.signal
        if self.exit_status is not None:
            fields["exit_status"] = self.exit_status
        if self.details is not None:
            fields["details"] = _keep_end(self.details, MAX_DETAILS_CHARS)
        return fields

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> Failure:
        """A failure as a worker sent it; what is not of the expected type is dropped (a worker runs
        the user's code, so its messages are not trusted to be well-formed)."""

        def text(name: str) -> str | None:
            value = fields.get(name)
            return value if isinstance(value, str) else None

        def integer(name: str) -> int | None:
            value = fields.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            kind=text("kind") or "internal",
            message=text("message") or "the analysis worker reported an error without a message.",
            path=text("path"),
            line=integer("line"),
            signal=text("signal"),
            exit_status=integer("exit_status"),
            details=text("details"),
        )


def _keep_start(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _keep_end(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]


_SIGNAL_MEANINGS: dict[int, str] = {
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGILL: "illegal instruction",
    signal.SIGFPE: "arithmetic error",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed",
    signal.SIGTERM: "terminated",
}


def oom_kill_count() -> int | None:
    """The kernel's count of out-of-memory kills since boot, or None where it is not kept."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def death_error(
    returncode: int,
    *,
    oom_killed: bool,
    last_phase: str | None,
) -> Failure:
    """Why a worker ended without sending a result."""
    during = f" while {last_phase}" if last_phase else ""
    if returncode < 0:
        number = -returncode
        name = signal_name(number)
        if number == signal.SIGKILL and oom_killed:
            return Failure(
                "out_of_memory",
                f"the analysis worker was killed by the kernel's out-of-memory killer{during}: memory ran "
                "out (the machine's, or its container's limit). Lower the batch size, or the model's size.",
                signal=name,
            )
        if number == signal.SIGKILL:
            return Failure(
                "crashed",
                f"the analysis worker was killed (SIGKILL){during}, by another process or by the kernel "
                "when memory ran out.",
                signal=name,
            )
        meaning = _SIGNAL_MEANINGS.get(number)
        return Failure(
            "crashed",
            f"the analysis worker crashed{during}: it was ended by {name}"
            + (f" ({meaning})" if meaning else "")
            + ", usually a fault in native code (a C/C++/CUDA extension, or a library it loads).",
            signal=name,
        )
    return Failure(
        "crashed",
        f"the analysis worker exited with status {returncode}{during}, before the analysis finished: "
        "the code ended the process (os._exit, or a library that exits).",
        exit_status=returncode,
    )


def time_limit_error(limit_s: float, last_phase: str | None) -> Failure:
    during = f" (it was {last_phase})" if last_phase else ""
    return Failure(
        "time_limit",
        f"the analysis ran longer than its time limit of {limit_s:g} s and was stopped{during}. "
        "An endless loop in the code? A model too slow to measure at this batch size?",
    )


def start_timeout_error(limit_s: float) -> Failure:
    return Failure(
        "worker_start",
        f"the analysis worker did not start within {limit_s:g} s (importing torch and finding the "
        "device took too long, or hung).",
    )


def garbled_error(detail: str) -> Failure:
    return Failure(
        "worker_protocol",
        f"the analysis worker sent a malformed message ({detail}) and was stopped. Does the code write "
        "to a file descriptor it did not open (the worker's message channel)?",
    )
