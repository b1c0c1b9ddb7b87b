"""Every process the user's code starts ends with its analysis, even one that left the worker's
process group (`subprocess.Popen(..., start_new_session=True)`, a daemon that forks twice).

Killing the worker's process group misses those, and once their parent is gone Linux hands them to
init, out of reach. So each worker is a *child subreaper* (`prctl(PR_SET_CHILD_SUBREAPER)`): an
orphan among its descendants is re-parented to the worker instead of init, and the worker's
descendants stay a tree rooted at it, found through the parent links in /proc. To end that tree,
the worker is first stopped (it can start nothing more), then every live descendant is killed,
again until none is left (a process being killed may have forked meanwhile), then the worker.

The service is a subreaper too, for workers that die on their own (a crash, the kernel's
out-of-memory killer): their orphans come to the service, which ends them (`end_orphans`).

Elsewhere than Linux none of this exists: the process group is all there is.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
from collections.abc import Collection

log = logging.getLogger("skyline.service")

PR_SET_CHILD_SUBREAPER = 36
# Rounds of looking for descendants and killing them; each round kills all it finds, so only a
# process forking as fast as it is killed needs more than a few.
MAX_KILL_ROUNDS = 100


def become_subreaper() -> bool:
    """Make this process the one orphans among its descendants are re-parented to (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, tuple[int, str]]:
    """Every process's (parent id, state letter), from /proc."""
    found: dict[int, tuple[int, str]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # it ended meanwhile
            # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split at the last ')'.
            fields = stat.rsplit(b")", 1)[-1].split()
            if len(fields) >= 2:
                found[int(entry)] = (int(fields[1]), fields[0].decode("ascii", "replace"))
    return found


def live_descendants(pid: int) -> list[int]:
    """The processes below `pid` that have not ended (zombies excluded)."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in parents.items():
        children.setdefault(parent, []).append(child)
    found: list[int] = []
    pending = list(children.get(pid, ()))
    while pending:
        child = pending.pop()
        pending.extend(children.get(child, ()))
        if parents[child][1] != "Z":
            found.append(child)
    return found


def kill_descendants(pid: int) -> None:
    """SIGKILL every live process below `pid`, until none is left."""
    for _ in range(MAX_KILL_ROUNDS):
        found = live_descendants(pid)
        if not found:
            return
        for descendant in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(descendant, signal.SIGKILL)
    log.warning("processes below %d kept starting new ones faster than they were killed", pid)


def kill_tree(pid: int) -> None:
    """Stop `pid` (it can start nothing more), end its descendants, then kill it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    kill_descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def end_orphans(keep: Collection[int]) -> list[int]:
    """Kill and reap this process's children other than `keep` (the workers): orphans of a worker
    that died, re-parented here because the service is a subreaper. Returns their ids."""
    me = os.getpid()
    orphans = [pid for pid, (parent, _) in _parents().items() if parent == me and pid not in keep]
    for orphan in orphans:
        kill_descendants(orphan)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(orphan, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(orphan, 0)
    return orphans
