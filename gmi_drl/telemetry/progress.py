"""The console progress line (printed by the CLI; library code only hands it `Progress`), and
the relay that brings GMI 0's `Progress` from its own process to a caller's ``on_progress``."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import socket
import tempfile
import threading
from multiprocessing.connection import Client, Listener
from typing import Callable, NamedTuple

log = logging.getLogger(__name__)


class Progress(NamedTuple):
    """Where a run stands after an update."""

    global_step: int
    total_steps: int
    sps: float
    """env steps per second since the run (or resume) started"""
    recent_return: float
    """mean return of the last 20 finished episodes (nan before the first)"""
    elapsed_s: float


def format_duration(seconds: float) -> str:
    """``"1h02m"``, ``"4m05s"``, ``"12s"``; ``"?"`` for nan/inf."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_progress(p: Progress) -> str:
    """``step 12,288/100,000 (12%) | 3,210 sps | return 134.5 | 4s elapsed | ETA 27s``."""
    pct = 100.0 * p.global_step / max(p.total_steps, 1)
    eta = (p.total_steps - p.global_step) / p.sps if p.sps > 0 else math.inf
    ret = "  n/a" if math.isnan(p.recent_return) else f"{p.recent_return:.1f}"
    return (f"step {p.global_step:,}/{p.total_steps:,} ({pct:3.0f}%) | {p.sps:,.0f} sps | "
            f"return {ret} | {format_duration(p.elapsed_s)} elapsed | ETA {format_duration(eta)}")


class ProgressPrinter:
    """Prints the progress line at most once per ``interval_s`` seconds of the run, and always
    the last one. Picklable: the CLI's printer travels to a GMI 0 in another process."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s, self._last = interval_s, -math.inf

    def __call__(self, p: Progress) -> None:
        if p.elapsed_s - self._last >= self.interval_s or p.global_step >= p.total_steps:
            self._last = p.elapsed_s
            print(format_progress(p), flush=True)


class ProgressSender:
    """GMI 0's ``on_progress`` in a process of its own: sends each `Progress` to the
    controller's `ProgressRelay` (picklable; it connects at its first call). Training never
    stops for it: where the relay cannot be reached, it warns once and sends no more."""

    def __init__(self, address: str, authkey: bytes) -> None:
        self.address, self.authkey = address, authkey
        self._conn, self._broken = None, False

    def __getstate__(self) -> dict:
        return {"address": self.address, "authkey": self.authkey}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["address"], state["authkey"])

    def __call__(self, p: Progress) -> None:
        if self._broken:
            return
        try:
            if self._conn is None:
                self._conn = Client(self.address, "AF_UNIX", authkey=self.authkey)
            self._conn.send(p)
        except (OSError, EOFError) as e:
            self._broken = True
            log.warning("progress no longer reaches the caller's on_progress (%s); training "
                        "goes on", e)


class ProgressRelay:
    """Calls ``on_progress`` in this process with the `Progress` that GMI 0 sends from another
    process of this machine (through `sender`): a Unix socket in a private temporary directory,
    authenticated, and a thread that calls ``on_progress`` in the order sent. A callback that
    raises is logged with its traceback and not called again; the run goes on (in its own
    process the exception would stop it, but a GMI elsewhere cannot be stopped from here).
    `close` returns once every `Progress` sent has been handed over (or after ``timeout_s``,
    with a warning, where the callback is that slow).

    Raises:
        OSError: the socket cannot be made (a TMPDIR path too long for one, or unwritable).
    """

    def __init__(self, on_progress: Callable[[Progress], None]) -> None:
        self.on_progress = on_progress
        self._dir = tempfile.mkdtemp(prefix="gmi-drl-progress-")
        self._address = os.path.join(self._dir, "progress.sock")
        self._authkey = os.urandom(16)
        try:
            self._listener = Listener(self._address, "AF_UNIX", authkey=self._authkey)
        except OSError:  # a TMPDIR too long for a socket path, say
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._accepted = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="gmi-drl-progress",
                                        daemon=True)
        self._thread.start()

    def sender(self) -> ProgressSender:
        """What GMI 0's payload carries as its ``progress``."""
        return ProgressSender(self._address, self._authkey)

    def _serve(self) -> None:
        try:
            conn = self._listener.accept()
        except Exception:  # noqa: BLE001 - `close`'s wake-up connection fails the handshake
            return
        finally:
            self._accepted.set()
        failed = False
        with conn:
            while True:
                try:
                    p = conn.recv()
                except (OSError, EOFError):
                    return
                if failed:
                    continue
                try:
                    self.on_progress(p)
                except Exception:  # noqa: BLE001 - the caller's code: say so, train on
                    failed = True
                    log.exception("on_progress raised; it is not called again in this run")

    def close(self, timeout_s: float = 10.0) -> None:
        """After the GMIs exited: hand over what is left, stop the thread, remove the socket.
        Idempotent."""
        try:
            if not self._accepted.is_set():  # no GMI connected: wake the accept
                with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as wake:
                    wake.connect(self._address)
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("on_progress still runs %.0f s after the GMIs ended; it may be "
                            "called after train() returned", timeout_s)
        finally:
            self._listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def relayed(progress: Callable[[Progress], None] | None):
    """The progress callback for GMIs in other processes of this machine: a caller's
    ``progress`` (``on_progress``) called here with what GMI 0 sends through a `ProgressRelay`;
    ``None`` and a `ProgressPrinter` (which prints there) pass as they are. Where no relay can
    be made (a TMPDIR too long for a Unix socket's path), GMI 0 prints the progress line."""
    if progress is None or isinstance(progress, ProgressPrinter):
        yield progress
        return
    try:
        relay = ProgressRelay(progress)
    except OSError as e:
        log.warning("on_progress cannot be relayed from the GMI processes (%s); GMI 0 prints "
                    "the progress line instead", e)
        yield ProgressPrinter()
        return
    try:
        yield relay.sender()
    finally:
        relay.close()


def printed_here(progress: Callable[[Progress], None] | None, warn: bool = True):
    """The progress callback for GMIs on Ray (possibly other hosts): the line printed where GMI
    0 runs, a caller's ``on_progress`` not called back (``warn``: say so)."""
    if progress is None or isinstance(progress, ProgressPrinter):
        return progress
    if warn:
        log.warning("on_progress is not called on Ray (GMI 0 may run on another host); GMI 0 "
                    "prints the progress line instead")
    return ProgressPrinter()
