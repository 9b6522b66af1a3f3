"""Helpers of the tests that start gmi-drl in processes: find its GMIs, wait for a run to reach
a point, and check that nothing of it is left."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def gmi_processes(pid: int) -> list[int]:
    """The spawned children of ``pid`` (its GMIs; not the resource tracker), oldest first (the
    launcher starts GMIs in id order)."""
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if int(fields[1]) == pid and "spawn_main" in cmd:
            kids.append((int(fields[19]), int(entry)))  # start time, in clock ticks
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


def wait_until_written(proc: subprocess.Popen, run: Path, pattern: str, what: str,
                       timeout_s: float = 120.0, poll_s: float = 0.2) -> None:
    """Wait until ``run`` holds a file matching ``pattern`` while ``proc`` still runs.

    Raises:
        AssertionError: ``proc`` ended or ``timeout_s`` passed first (``what`` says what).
    """
    deadline = time.monotonic() + timeout_s
    while not list(run.glob(pattern)):
        assert proc.poll() is None and time.monotonic() < deadline, what
        time.sleep(poll_s)


def assert_group_gone(pgid: int, shm_before: set[str], timeout_s: float = 5.0) -> None:
    """No process of group ``pgid`` and no new ``/dev/shm`` entry is left within ``timeout_s``
    (multiprocessing's resource tracker exits, and unlinks, right after its parent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = group_members(pgid)
        if not left and set(os.listdir("/dev/shm")) <= shm_before:
            break
        time.sleep(0.2)
    assert left == [], f"processes left: {left}"
    assert set(os.listdir("/dev/shm")) <= shm_before
