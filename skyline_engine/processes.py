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

Where the system lets the service make cgroups below its own, each worker also runs in a `Cgroup`
of its own, which the kernel ends whole: nothing born in it escapes, however fast it forks.

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
from dataclasses import dataclass

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


@dataclass(frozen=True)
class _Process:
    parent: int
    state: str  # the state letter: "Z" for a zombie (ended, not reaped)
    group: int  # its process group


def _processes() -> dict[int, _Process]:
    """Every process's parent, state and process group, from /proc."""
    found: dict[int, _Process] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue  # it ended meanwhile
            # "pid (comm) state ppid pgrp …": comm may hold spaces and parentheses, so split at the last ')'.
            fields = stat.rsplit(b")", 1)[-1].split()
            if len(fields) >= 3:
                found[int(entry)] = _Process(int(fields[1]), fields[0].decode("ascii", "replace"), int(fields[2]))
    return found


def _descendants(pid: int, processes: dict[int, _Process]) -> list[int]:
    """The processes below `pid`, zombies included."""
    children: dict[int, list[int]] = {}
    for child, process in processes.items():
        children.setdefault(process.parent, []).append(child)
    found: list[int] = []
    pending = list(children.get(pid, ()))
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(children.get(child, ()))
    return found


def live_descendants(pid: int) -> list[int]:
    """The processes below `pid` that have not ended (zombies excluded)."""
    processes = _processes()
    return [child for child in _descendants(pid, processes) if processes[child].state != "Z"]


def kill_descendants(pid: int) -> None:
    """SIGKILL every live process below `pid`, until none is left. The process groups of its
    descendants, zombies' too, are killed whole first (this process's group and `pid`'s spared):
    a chain that forks and exits in a loop (after `setsid`) lives a hundred microseconds per link,
    and its live link is always newer than the list of processes a scan of /proc read, so kills
    by process id never found it; its ended links, left as zombies, still name its group, which
    the kernel kills whole (a fork racing the kill fails)."""
    spared = {os.getpgrp(), pid}
    killed_groups: set[int] = set()
    for _ in range(MAX_KILL_ROUNDS):
        processes = _processes()
        below = _descendants(pid, processes)
        for group in {processes[child].group for child in below} - spared - killed_groups:
            killed_groups.add(group)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        found = [child for child in below if processes[child].state != "Z"]
        if not found:
            return
        for descendant in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(descendant, signal.SIGKILL)
    log.warning("processes below %d kept starting new ones faster than they were killed", pid)


def own_children() -> list[int]:
    """This process's children, zombies included, from each of its threads' `children` list in
    /proc (cheap: no scan of every process); from that scan where the kernel does not list them."""
    tasks = f"/proc/{os.getpid()}/task"
    try:
        found: list[int] = []
        for task in os.listdir(tasks):
            with open(os.path.join(tasks, task, "children"), encoding="ascii") as f:
                found += [int(pid) for pid in f.read().split()]
        return found
    except (OSError, ValueError):
        me = os.getpid()
        return [child for child, process in _processes().items() if process.parent == me]


def kill_tree(pid: int) -> None:
    """Stop `pid` (it can start nothing more), end its descendants, then kill it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    kill_descendants(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def end_orphans(orphans: Collection[int]) -> None:
    """Kill and reap `orphans`, children of this process that are not its workers: processes of a
    worker that died, re-parented here because the service is a subreaper, with what they started.
    One scan of /proc for them all: a zombie (most of a fork chain's links) has nothing below it and
    is only reaped; scanning again for each of 2,450 of them had stalled the service for 95 s."""
    processes = _processes()
    for orphan in orphans:
        process = processes.get(orphan)
        if process is not None and process.state != "Z":
            # Its group killed only where it leads it: its pid, so the group's id, stays ours until
            # it is reaped. Another group's id, read in the scan, can be free again by now and taken
            # (a fork chain cycles through every pid in seconds): a spare worker started meanwhile,
            # in a session of its own, would be killed and left a zombie, the likely cause of the
            # zombie the fork-chain test found twice. Members of such a group are this orphan's
            # descendants or orphans themselves, ended here all the same.
            if process.group == orphan != os.getpgrp():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(orphan, signal.SIGKILL)
            kill_descendants(orphan)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(orphan, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(orphan, 0)


class Cgroup:
    """A cgroup (v2) of its own for a worker and every process it starts, where this process's
    cgroup can have children (Linux 5.14 or later, the hierarchy writable here: a container's own,
    or a subtree delegated to the user). The kernel keeps every descendant in it, whatever session
    or parent it takes, and `kill` ends them all at once (`cgroup.kill`): a chain that calls
    `setsid` and forks at every link outruns kills by process and by group, never this one."""

    def __init__(self, path: str) -> None:
        self.path = path

    @staticmethod
    def create(name: str) -> Cgroup | None:
        """A new child of this process's cgroup; None where there can be none."""
        parent = own_cgroup_folder()
        if parent is None:
            return None
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except OSError:
            return None
        if not os.path.exists(os.path.join(path, "cgroup.kill")):  # before Linux 5.14
            with contextlib.suppress(OSError):
                os.rmdir(path)
            return None
        return Cgroup(path)

    def add(self, pid: int) -> bool:
        """Move `pid` into it (the processes it starts afterwards are born there)."""
        return self._write("cgroup.procs", str(pid))

    def kill(self) -> None:
        self._write("cgroup.kill", "1")

    def remove(self) -> bool:
        """Kill what is in it, then remove it once its processes have exited (a zombie is no longer
        in it); False where some had not yet (remove it later)."""
        self.kill()
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def _write(self, name: str, value: str) -> bool:
        try:
            with open(os.path.join(self.path, name), "w", encoding="ascii") as f:
                f.write(value)
        except OSError:
            return False
        return True


def remove_stale_cgroups(prefix: str) -> None:
    """Remove the cgroups below this process's own named `prefix<pid>-…` whose process `pid` has
    ended (a service killed with no chance to remove its workers'), and end what is still in them."""
    parent = own_cgroup_folder()
    if parent is None:
        return
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            owner = name[len(prefix) :].split("-", 1)[0] if name.startswith(prefix) else ""
            if owner.isdigit() and not _alive(int(owner)):
                Cgroup(os.path.join(parent, name)).remove()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def own_cgroup_folder() -> str | None:
    """The folder of this process's cgroup in the cgroup v2 hierarchy, where it is mounted."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            own = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    for fields in mounts:
        # "id parent major:minor root mount-point options [optional…] - type source super-options"
        if own is None or "-" not in fields or fields[fields.index("-") + 1] != "cgroup2":
            continue
        root, mount_point = fields[3], fields[4]
        if own == root or own.startswith(root.rstrip("/") + "/"):
            return os.path.join(mount_point, own[len(root.rstrip("/")) :].lstrip("/"))
    return None
