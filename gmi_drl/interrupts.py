"""Ctrl-C that CPython would drop, noted so that it is raised where a run starts.

CPython drops (prints as "Exception ignored") a ``KeyboardInterrupt`` raised inside a callback it
runs for itself, such as the import system's module-lock clean-up: a Ctrl-C in a command's first
seconds of imports was lost, and the command went on as if none had come. The CLI enters
`noting_interrupts` before its imports; `raise_if_interrupted`, where a run or a probe starts,
raises a noted one again. Standard library only, so that it is importable first.
"""

from __future__ import annotations

import contextlib
import signal
import threading

INTERRUPTED = threading.Event()
"""set by `noting_interrupts`' handler when Ctrl-C arrives (the CLI's commands)"""


def _noted_interrupt(signum, frame) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


@contextlib.contextmanager
def noting_interrupts():
    """Inside the block (in the main thread, where SIGINT has Python's default handler) Ctrl-C
    raises ``KeyboardInterrupt`` as always and is also noted in `INTERRUPTED`. CPython drops
    (prints as "Exception ignored") an interrupt that lands in a callback it runs for itself,
    such as the import system's module-lock clean-up: a Ctrl-C in a command's first seconds of
    imports was lost, and the command went on as if none had come. `raise_if_interrupted`, where
    a run or a probe starts, raises it again."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    INTERRUPTED.clear()
    signal.signal(signal.SIGINT, _noted_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        INTERRUPTED.clear()  # (the block's interrupts are the block's)


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` where Ctrl-C came and was lost (`noting_interrupts`)."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
