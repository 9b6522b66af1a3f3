"""Algorithm 2's control flow ("Profiling-based GMI Exploration", GMI-DRL §5.2) over any
``profile`` and ``estimate``: the points it looks at, their saturation, and the pick."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence



@dataclass
class Point:
    """One profiled (GMIs per device, num_envs) point.

    ``top``: env steps per second of all the device's GMIs together (async_training: samples
    trained on per second); ``mem``: peak memory of its largest GMI, bytes. ``terms``: the probe's phase
    figures (`gmi_drl.tune.probe.measure`). ``sat`` and ``estimate`` are filled by `search` where
    Algorithm 2 computes them.
    """

    gmis: int
    num_envs: int
    runnable: bool
    top: float = 0.0
    mem: float = 0.0
    seconds: float = 0.0
    """wall seconds the profile took (start-up included)"""
    reason: str = ""
    """why it is not runnable"""
    terms: dict = field(default_factory=dict)
    sat: float | None = None
    estimate: float | None = None
    cached: bool = False


@dataclass
class SearchResult:
    """What `search` found: the chosen ``(num_envs, gmis)`` (None when no point was estimated),
    its estimate, every point in profiling order, and whether the budget cut the search."""

    best: tuple[int, int] | None
    best_estimate: float
    points: list[Point]
    budget_exhausted: bool = False


def saturation(r_top: float, r_mem: float) -> float:
    """Algorithm 2 line 17, ``Sat = R_top / R_mem``. Memory that did not grow (``R_mem <= 0``)
    costs nothing, so a throughput gain then counts as unsaturated (``inf``) and no gain as
    saturated (``-inf``)."""
    if r_mem > 0:
        return r_top / r_mem
    return math.inf if r_top > 0 else -math.inf


def search(gmis_values: Sequence[int], envs_grid: Sequence[int],
           profile: Callable[[int, int], Point], estimate: Callable[[int, Point], float],
           alpha: float = 0.1, over_budget: Callable[[], bool] = lambda: False,
           on_point: Callable[[Point], None] | None = None) -> SearchResult:
    """Algorithm 2 ("Profiling-based GMI Exploration", GMI-DRL §5.2).

    For GMIs per device in ``gmis_values`` (the paper: 10 down to 1) and ``num_envs`` in
    ``envs_grid`` (ascending): a point that is not runnable is skipped (lines 6-8); the first
    runnable point of a GMI count only initialises ``pre_top``/``pre_mem`` (lines 10-13; so
    does one after a point of no throughput or memory, which the ratios cannot divide by); each
    later one computes ``Sat`` from the relative changes of throughput and memory (lines 15-18)
    and ends the inner loop when ``Sat < alpha`` (lines 19-21), else is estimated and kept when
    its estimate beats every earlier one, strictly (lines 23-26: ties keep the earlier point).

    Args:
        gmis_values: GMIs per device, in search order.
        envs_grid: num_envs values per GMI, ascending.
        profile: ``(gmis, num_envs) -> Point``.
        estimate: ``(gmis, point) -> whole-system throughput``.
        alpha: the saturation threshold.
        over_budget: asked before each profile; True ends the search (the budget).
        on_point: called with every point after Algorithm 2 has looked at it.
    """
    best, max_top, points = None, -math.inf, []
    for gmis in gmis_values:
        pre_top = pre_mem = 0.0
        for num_envs in envs_grid:
            if over_budget():
                return SearchResult(best, max_top, points, budget_exhausted=True)
            point = profile(gmis, num_envs)
            points.append(point)
            try:
                if not point.runnable:
                    continue
                if pre_top <= 0 or pre_mem <= 0:  # (a point of 0 could not be divided by)
                    pre_top, pre_mem = point.top, point.mem
                    continue
                point.sat = saturation((point.top - pre_top) / pre_top,
                                       (point.mem - pre_mem) / pre_mem)
                pre_top, pre_mem = point.top, point.mem
                if point.sat < alpha:
                    break
                point.estimate = estimate(gmis, point)
                if point.estimate > max_top:
                    max_top, best = point.estimate, (num_envs, gmis)
            finally:
                if on_point is not None:
                    on_point(point)
    return SearchResult(best, max_top, points)


def envs_grid(low: int, high: int) -> list[int]:
    """``low, 2 low, 4 low, ...`` up to ``high`` (Algorithm 2's doubling grid).

    Raises:
        ValueError: ``low < 1`` or ``high < low``.
    """
    if low < 1 or high < low:
        raise ValueError(f"num_envs grid {low}..{high}: need 1 <= low <= high")
    grid = [low]
    while grid[-1] * 2 <= high:
        grid.append(grid[-1] * 2)
    return grid


def choose(result: SearchResult) -> tuple[Point | None, str]:
    """Algorithm 2's pick; where it estimated no point (every GMI count saturated at its second
    runnable point, or the budget ended the search first), the fastest runnable point."""
    if result.best is not None:
        num_envs, gmis = result.best
        point = next(p for p in result.points if (p.num_envs, p.gmis) == (num_envs, gmis))
        return point, "Algorithm 2"
    runnable = [p for p in result.points if p.runnable]
    if not runnable:
        return None, "no runnable point"
    return max(runnable, key=lambda p: p.top), "fastest measured point (Algorithm 2 estimated none)"
