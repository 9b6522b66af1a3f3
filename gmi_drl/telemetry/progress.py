"""The console progress line (printed by the CLI; library code only hands it `Progress`)."""

from __future__ import annotations

import math
from typing import NamedTuple


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
