"""Helpers of the tests that start gmi-drl in processes: find its GMIs, wait for a run to reach
a point, and check that nothing of it is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def _processes() -> dict[int, tuple[int, int, str, str]]:
    """Every process: pid -> (parent pid, start time in clock ticks, state, command line)."""
    table = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline") as f:
                cmd = f.read()
            table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0], cmd)
        except (OSError, ValueError, IndexError):
            continue
    return table


_SERVER = "forkserver import main"


def _helper(pid: int, table: dict) -> bool:
    """Whether ``pid`` is one of multiprocessing's own processes: the resource tracker, or the
    fork server (whose children, the processes it forked, share its command line)."""
    ppid, _, _, cmd = table[pid]
    return "resource_tracker" in cmd or (_SERVER in cmd and _SERVER not in
                                         table.get(ppid, (0, 0, "", ""))[3])


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (children, their children, ...), except
    multiprocessing's resource tracker and fork server (the GMIs a fork server started are
    listed: they are what ``pid`` launched)."""
    table = _processes()
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (ppid, _, state, _) in table.items()
                    if ppid in frontier and state != "Z"}
        out |= frontier
    return {p for p in out if not _helper(p, table)}


def fork_server(pid: int) -> int | None:
    """The fork server that ``pid`` started (its GMIs' parent), or ``None``."""
    table = _processes()
    return next((p for p, (ppid, _, state, cmd) in table.items()
                 if ppid == pid and state != "Z" and _SERVER in cmd), None)


def running(pids) -> list[int]:
    """Those of ``pids`` that still run (exist and have not ended as zombies)."""
    table = _processes()
    return [p for p in pids if p in table and table[p][2] != "Z"]


def gmi_processes(pid: int) -> list[int]:
    """The GMIs of the controller ``pid``, oldest first (the launcher starts GMIs in id order):
    the children of its fork server, and those it spawned (a GMI under a prefix)."""
    table = _processes()
    servers = {p for p, (ppid, _, _, cmd) in table.items() if ppid == pid and _SERVER in cmd}
    kids = [(start, p) for p, (ppid, start, state, cmd) in table.items()
            if state != "Z" and ((ppid in servers) or (ppid == pid and "spawn_main" in cmd))]
    return [p for _, p in sorted(kids)]


def group_members(pgid: int, zombies: bool = True) -> list[int]:
    """The processes of process group ``pgid``, as ``pgrep -g`` lists them; ``zombies=False``
    leaves out those that ended and wait to be reaped (children of a killed parent wait for
    init, which this sandbox's init may take its time over)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and (zombies or fields[0] != "Z"):
            pids.append(int(entry))
    return pids


def confined_tmp(cwd: Path) -> dict[str, str]:
    """An environment whose temporary directory is ``cwd/tmp``, for a child whose leftovers a
    test checks (`assert_group_gone`) or which is killed where nothing can clean up;
    torch.compile's cache stays where it was. ``cwd/tmp`` links to a short directory of the
    system's (removed when this process exits): a fork server's socket path under pytest's
    ``tmp_path`` could pass the 108 bytes of a UNIX socket's address."""
    import atexit
    import shutil
    import tempfile

    link = cwd / "tmp"
    if not link.exists():
        short = tempfile.mkdtemp(prefix="gt-", dir="/tmp")
        atexit.register(shutil.rmtree, short, True)
        link.symlink_to(short)
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR",
                           os.path.join(tempfile.gettempdir(), "torchinductor_root"))
    return {**os.environ, "TMPDIR": os.path.realpath(link), "TORCHINDUCTOR_CACHE_DIR": cache}


def start_cli(args: list[str], cwd: Path) -> subprocess.Popen:
    """``gmi-drl ARGS`` as a terminal's job: in a process group of its own, with the default
    handling of Ctrl-C and of a hangup (a background shell ignores the one, ``nohup`` the
    other), stdout dropped, stderr piped as text, temporary files in ``cwd/tmp``."""
    def as_a_terminal_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    return subprocess.Popen([sys.executable, "-m", "gmi_drl.cli", *args], cwd=cwd,
                            env=confined_tmp(cwd), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_a_terminal_job)


def signal_group(proc: subprocess.Popen, ready: Callable[[], object], sig: int,
                 timeout_s: float = 30.0) -> str:
    """Once ``ready()`` returns, send ``sig`` to ``proc``'s whole group (SIGINT: what Ctrl-C in
    a terminal does); returns ``proc``'s stderr once it ended (it is killed if it did not)."""
    try:
        ready()
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
    return err


def wait_until_written(proc: subprocess.Popen, run: Path, pattern: str, what: str,
                       timeout_s: float = 120.0, poll_s: float = 0.2) -> None:
    """Wait until ``run`` holds a file matching ``pattern`` while ``proc`` still runs.

    Raises:
        AssertionError: ``proc`` ended (its stderr is in the message) or ``timeout_s`` passed
            first (``what`` says what).
    """
    deadline = time.monotonic() + timeout_s
    while not list(run.glob(pattern)):
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"{what}: the process ended with {proc.returncode}\n{err}")
        assert time.monotonic() < deadline, f"{what} in {timeout_s} s"
        time.sleep(poll_s)


def shm_entries() -> set[str]:
    """The names in ``/dev/shm`` now."""
    return set(os.listdir("/dev/shm"))


def shm_held(pids) -> set[str]:
    """The ``/dev/shm`` names that processes ``pids`` hold open or mapped. Matched by inode:
    glibc makes a POSIX semaphore (multiprocessing's locks and queues) under a temporary name,
    maps it, then links it to its own name and unlinks the temporary one, so a live
    semaphore's mapping names a deleted file, not the ``sem.mp-...`` entry."""
    inodes = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                inodes.update(int(line.split()[4]) for line in f.read().splitlines()
                              if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except (OSError, ValueError, IndexError):  # ended meanwhile, or not ours to read
            continue
    held = set()
    for name in shm_entries():
        try:
            if os.stat(f"/dev/shm/{name}").st_ino in inodes:
                held.add(name)
        except OSError:  # unlinked meanwhile
            continue
    return held


def _held_elsewhere() -> set[str]:
    """``/dev/shm`` names that a live process outside this one and its descendants holds open
    or mapped: those of another test running beside this one (pytest-xdist's other workers)."""
    table = _processes()
    mine, frontier = {os.getpid()}, {os.getpid()}
    while frontier:  # this process's tree, multiprocessing's helpers included
        frontier = {p for p, (ppid, *_) in table.items() if ppid in frontier}
        mine |= frontier
    return shm_held(set(table) - mine)


def shm_left(before: set[str], timeout_s: float = 10.0) -> set[str]:
    """``/dev/shm`` entries made since ``before`` that no other live process holds, once none
    is or ``timeout_s`` passed: what this test (its process and what it started) left behind.
    A test beside it in another pytest-xdist worker holds its own entries open or mapped while
    they live; what a test there kills with SIGKILL is held by no one until that test (or
    the next run's `gmi_drl.blocks.reclaim_orphans`) removes it, a second or two later."""
    deadline = time.monotonic() + timeout_s
    while True:
        new = shm_entries() - before
        if new:
            new -= _held_elsewhere()
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def assert_group_gone(pgid: int, shm_before: set[str], cwd: Path | None = None,
                      timeout_s: float = 5.0) -> None:
    """No process of group ``pgid`` and no new ``/dev/shm`` entry is left within ``timeout_s``
    (multiprocessing's resource tracker exits, and unlinks, right after its parent), nor,
    with ``cwd`` (the group started by `start_cli` there), a temporary directory of
    gmi-drl's or multiprocessing's in ``cwd/tmp``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = group_members(pgid)
        if not left and not shm_left(shm_before, 0):
            break
        time.sleep(0.2)
    assert left == [], f"processes left: {left}"
    new = shm_left(shm_before)
    assert not new, f"shared memory left: {sorted(new)}"
    if cwd is not None:
        temp = [n for n in os.listdir(cwd / "tmp") if n.startswith(("gmi-drl-", "pymp-"))]
        assert not temp, f"temporary directories left: {temp}"
