"""A probe (`gmi_drl.tune.probe`) in a process group of its own, forked from multiprocessing's
fork server, with a time limit: started, waited for, and ended with everything it started."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gmi_drl.gmi.launcher import COMPILER, mp_context, signals_deferred
from gmi_drl.interrupts import raise_if_interrupted


PROBE_PRELOAD = ("gmi_drl.tune.probe", "gmi_drl.train", *COMPILER)
"""what the fork server that starts the probes imports once: a probe forked from it starts
without importing them (about 4 s of a 1-GMI probe's 7-10 s on machine A, where the GMI trains in
the probe's own process)"""


def run_probe(config: dict, warmup: int, iterations: int, timeout_s: float,
              min_steps: int = 0, target: str = "gmi_drl.tune.probe:main") -> dict:
    """Run `gmi_drl.tune.probe` on ``config`` in a process of its own, forked from
    multiprocessing's fork server (`PROBE_PRELOAD` imported there once), in a new session;
    returns its figures. ``target`` (``"module:function"``, called with ``[REQUEST.json,
    RESULT.json]``, returning the exit status) is the probe's entry point.

    Raises:
        ProbeFailed: it ended without writing its figures (a crash, the kernel's OOM killer),
            or ran past ``timeout_s`` (then its whole process group, GMIs and env workers
            included, is stopped first).
    """
    with tempfile.TemporaryDirectory(prefix="gmi-drl-tune-") as tmp:
        request, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        log_path = Path(tmp) / "probe.log"
        request.write_text(json.dumps({"config": config, "warmup": warmup,
                                       "iterations": iterations, "min_steps": min_steps}))
        log_path.touch()
        ctx = mp_context("forkserver", PROBE_PRELOAD)
        process = ctx.Process(target=_probe_main, name="gmi-drl-probe",
                              args=(target, str(request), str(result), str(log_path),
                                    dict(os.environ)))
        proc = None
        try:
            # an interrupt inside start() would leave a probe the server forks after it
            raise_if_interrupted()
            with signals_deferred(signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                process.start()
                proc = _Forked(process)
            hung = not _wait_for(proc, result, timeout_s)
        finally:
            if proc is not None:  # on a timeout the probe; always GMIs or workers it left
                _kill_group(proc)
        text = log_path.read_text(errors="replace")
        if hung:
            raise ProbeFailed(f"hung: still running after {timeout_s:.0f} s (killed) "
                              f"{_how_far(text)}")
        if not result.exists():
            what = ("killed by the kernel (out of memory?)" if proc.returncode == -9
                    else f"exit status {proc.returncode}")
            last = _last_line(text)
            raise ProbeFailed(f"{what}: {last[:300]}" if last else
                              f"{what} before the probe started (its traceback is on this "
                              "process's stderr; a script that runs tune needs the 'if __name__ "
                              "== \"__main__\":' guard: the fork server imports it)")
        return json.loads(result.read_text())


def _probe_main(target: str, request: str, result: str, log_path: str, environ: dict) -> None:
    """A probe, in the process the fork server forked: a session of its own (so that the whole
    group can be stopped at the limit), the caller's environment (the server has the one it was
    started with), stdout and stderr into ``log_path``."""
    os.setsid()
    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None  # TMPDIR as the caller has it, not as the server had it
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:  # the caller gave this probe up before it started
        os._exit(0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # (the server's children start with it ignored)
    module, name = target.split(":")
    sys.exit(getattr(importlib.import_module(module), name)([request, result]))


class _Forked:
    """A `multiprocessing.Process` as much of a `subprocess.Popen` as `_wait_for` and
    `_kill_group` use: ``pid``, ``poll``, ``wait`` and ``returncode``."""

    def __init__(self, process) -> None:
        self._process, self.pid = process, process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("gmi-drl probe", timeout)
        return self._process.exitcode


def _wait_for(proc: _Forked, result: Path, timeout_s: float) -> bool:
    """Wait until ``proc`` exits or has written ``result`` (the probe writes it whole, with
    `os.replace`, once its run has ended); False when neither happened within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not result.exists():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            proc.wait(timeout=min(left, 0.05))
            return True
        except subprocess.TimeoutExpired:
            pass
    return True


def _last_line(log: str) -> str:
    """The probe's last line of output, less the resource tracker's warning about what it
    unlinked after the probe died (two lines: the warning and its source line)."""
    lines = [line for line in log.splitlines() if line.strip()]
    while lines and ("resource_tracker" in lines[-1]
                     or lines[-1].lstrip().startswith("warnings.warn(")):
        lines.pop()
    return lines[-1] if lines else ""


def _how_far(log: str) -> str:
    """Where a probe stood when it was killed, from the progress lines it prints per update:
    still starting (imports, env workers, compilation), or its last update, so that a user can
    tell a stuck point from a time limit too short for the job."""
    steps = [line.strip() for line in log.splitlines() if line.startswith("step ")]
    if not steps:
        return "before its first update ended (start-up: imports, envs, compilation)"
    return (f"at {steps[-1].split('|')[0].strip()} after {len(steps)} update(s): still "
            "progressing, so --probe-timeout-s may be too short for this job")


class ProbeFailed(RuntimeError):
    """A profiled point did not run to its end (Algorithm 2: not runnable)."""


def _kill_group(proc: _Forked | subprocess.Popen, grace_s: float = 5.0) -> None:
    """End the process group that ``proc`` leads. SIGTERM first: the GMIs leave through their
    handlers and a probe unwinds its run (`gmi_drl.tune.probe.main`), which unlinks the shared
    memory and removes the temporary directories they held (a SIGKILL to the whole group left
    those behind). SIGKILL then ends whatever is still running ``grace_s`` seconds later (a
    process stuck where no handler runs); what it held in /dev/shm is unlinked by
    multiprocessing's resource tracker when this process exits (a forked probe shares it)."""
    running = True
    try:
        if not _signal_group(proc, signal.SIGTERM):
            running = False  # neither the group nor the probe is there
        deadline = time.monotonic() + grace_s
        while running and time.monotonic() < deadline:
            proc.poll()  # reap the leader: a zombie runs nothing
            running = _running_in_group(proc.pid) or proc.poll() is None
            if running:
                time.sleep(0.02)
    except PermissionError:
        pass
    finally:
        if running or proc.poll() is None:
            try:
                _signal_group(proc, signal.SIGKILL)
            except PermissionError:
                pass
        proc.wait()


def _signal_group(proc: _Forked | subprocess.Popen, signum: int) -> bool:
    """Send ``signum`` to the process group ``proc`` leads; where there is none yet (a probe
    before its ``setsid``, still in the fork server's group, with nothing started), to ``proc``
    alone. False when neither is there."""
    try:
        os.killpg(proc.pid, signum)
        return True
    except ProcessLookupError:
        pass
    if proc.poll() is not None:
        return False
    try:
        os.kill(proc.pid, signum)
        return True
    except ProcessLookupError:
        return False


def _running_in_group(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs: from /proc, zombies left out; without
    /proc, whether the group has a member at all (a zombie counts there)."""
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
