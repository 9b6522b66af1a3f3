"""``summary.md`` and ``learning_curve.png`` of a finished run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from gmi_drl.files import write_text_atomically
from gmi_drl.telemetry.timer import SectionStats


class RunSummary(NamedTuple):
    """What a finished run reports."""

    title: str
    """e.g. ``"PPO on Hopper-v5 (seed 1)"``"""
    global_step: int
    wall_s: float
    """seconds of this process's training loop"""
    steps_this_process: int
    """env steps taken by this process (less than global_step after a resume)"""
    curve_steps: np.ndarray
    """``(k,) int64`` global_step at which each episode finished"""
    curve_returns: np.ndarray
    """``(k,) float64`` episode returns"""
    phases: dict[str, SectionStats]
    """the timing tree"""
    episodes_of: str = ""
    """whose episodes the curve holds, where not the whole run's (e.g. ``"GMI 0's envs, of 4
    GMIs"``)"""
    steady_sps: float = float("nan")
    """env steps/s after the loop's first iteration (nan: not measured)"""


def final_return(s: RunSummary, last: int = 20) -> float:
    """Mean return of the last ``last`` episodes (nan when none finished)."""
    r = s.curve_returns[-last:]
    return float(r.mean()) if len(r) else float("nan")


def first_crossing(steps: np.ndarray, returns: np.ndarray, wall: np.ndarray, target: float,
                   window: int = 20) -> tuple[int, float] | None:
    """``(global_step, wall_s)`` when the mean of the last ``window`` episodes first reached
    ``target``, or ``None``."""
    if len(returns) < window:
        return None
    mean = np.convolve(returns, np.ones(window) / window, mode="valid")
    hit = np.flatnonzero(mean >= target)
    if not len(hit):
        return None
    i = hit[0] + window - 1
    return int(steps[i]), float(wall[i])


def plot_learning_curve(s: RunSummary, path: str | Path) -> None:
    """Episode returns against global_step, raw and as a 20-episode moving mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if len(s.curve_returns):
        ax.plot(s.curve_steps, s.curve_returns, ".", ms=2, alpha=0.3, label="episode")
        k = min(20, len(s.curve_returns))
        smooth = np.convolve(s.curve_returns, np.ones(k) / k, mode="valid")
        ax.plot(s.curve_steps[k - 1:], smooth, label=f"mean of {k}")
        ax.legend()
    ax.set_xlabel("global_step (env steps)")
    ax.set_ylabel("env/episodic_return")
    ax.set_title(s.title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_summary(s: RunSummary, run_dir: str | Path,
                  sections: dict[str, str] | None = None) -> Path:
    """Write ``summary.md`` (returns, throughput, phase breakdown, then ``sections``: ``{title:
    markdown}``) and ``learning_curve.png``."""
    run_dir = Path(run_dir)
    plot_learning_curve(s, run_dir / "learning_curve.png")
    sps = s.steps_this_process / s.wall_s if s.wall_s > 0 else float("nan")
    lines = [
        f"# {s.title}", "",
        f"- global_step: {s.global_step:,}",
        f"- episodes finished: {len(s.curve_returns):,}"
        + (f" ({s.episodes_of})" if s.episodes_of else ""),
        f"- final return (mean of last 20 episodes): {final_return(s):.2f}",
        f"- wall time: {s.wall_s:.1f} s; throughput: {sps:,.0f} env steps/s (perf/sps)"
        + (f"; {s.steady_sps:,.0f} after the first iteration, which pays the one-time costs "
           "(torch.compile, first allocations)" if math.isfinite(s.steady_sps) else ""),
    ]
    start = s.global_step - s.steps_this_process
    if start > 0:
        lines.append(f"- the wall time, throughput and phases are those of the last training "
                     f"loop alone, from global_step {start:,} (a resume, or a restart after "
                     "a failure); metrics.csv has the earlier loops' rows")
    lines += [
        "", "## Phase breakdown", "",
        "| phase | total s | % of wall | calls | mean ms |", "|---|---:|---:|---:|---:|",
    ]
    for path, st in s.phases.items():
        depth = path.count("/")
        name = "&nbsp;&nbsp;" * depth + path.rsplit("/", 1)[-1]
        pct = 100.0 * st.total_s / s.wall_s if s.wall_s > 0 else float("nan")
        lines.append(f"| {name} | {st.total_s:.2f} | {pct:.1f} | {st.calls:,} | "
                     f"{1e3 * st.total_s / max(st.calls, 1):.3f} |")
    rest = s.wall_s - sum(st.total_s for path, st in s.phases.items() if "/" not in path)
    if s.phases and s.wall_s > 0 and rest > 0:
        lines.append(f"| *outside these phases* (loop, waits, a profiler's own work) | "
                     f"{rest:.2f} | {100.0 * rest / s.wall_s:.1f} | | |")
    lines += ["", "![learning curve](learning_curve.png)", ""]
    for title, text in (sections or {}).items():
        lines += [f"## {title}", "", text.rstrip("\n"), ""]
    return write_text_atomically(run_dir / "summary.md", "\n".join(lines))
