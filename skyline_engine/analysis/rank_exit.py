"""How a rank of data-parallel training leaves: without finalizing the interpreter.

After a rank's last collective, gloo's worker threads still let go of that collective's tensors,
which takes the GIL; one that tries while the interpreter is finalizing aborts the whole process
("terminate called without an active exception", SIGABRT: 2 torchrun runs in 27 on a busy 2-core
machine, and about 1 failing `--nproc` analysis in 10; pytorch/pytorch#179291 on the same cause).
So a rank flushes its streams and ends with `os._exit`; its outputs are written and closed by then,
and the user's atexit handlers do not run, as in the service's workers. No torch here: the command
line imports this before any analysis starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import NoReturn

# How long a rank that only waited for a peer (its collective failed because the peer died) stays
# before it exits. The launcher records only the first failed process it finds, every 0.1 s; a rank
# that exits at once can be found before the peer that died first, and be named as the cause.
WAITED_LINGER_S = 2.0


def exit_without_finalizing(code: int) -> NoReturn:
    """End this process now, with `code`, its streams flushed: a rank, or a command whose user
    code left a thread running that the interpreter's exit would wait for."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing to keep
            stream.flush()
    os._exit(code)


def exit_failed_rank(waited: bool) -> NoReturn:
    """End a failed rank whose error is written. One that `waited` for a peer first gives the
    launcher time to find the peer's death, and is then ended by the launcher (its SIGTERM ends it
    as the system does, finalizing nothing) or by itself."""
    if waited:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(WAITED_LINGER_S)
    exit_without_finalizing(1)
