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
