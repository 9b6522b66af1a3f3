"""Templates: what a run's GMIs do, apart from where they run (GMI-DRL §5.1's templates).

A template names the target every GMI runs (the role follows from the GMI's id), its GMIs'
layout, the resources the GMIs share (made before any GMI starts, removed after the last one
ended, whatever happened) and the summary lines it adds. The placements
(`gmi_drl.runner.placement`: serial threads, local processes, Ray actors) launch any template.

- `SyncTemplate`: ``sync_training``: holistic GMIs, each collecting and learning, reducing
  gradients through the layout's reduction (the placements make its groups).
- `gmi_drl.runner.async_template.AsyncTemplate`: ``async_training``: trainer and serving GMIs
  joined by experience channels and a weight store.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, Protocol

from gmi_drl.config import TrainConfig
from gmi_drl.gmi.layout import Layout

SYNC_TARGET = "gmi_drl.runner.loop:gmi_main"
"""the GMI target of ``sync_training``"""


class Template(Protocol):
    """What a placement needs to know of a run's GMIs."""

    target: str
    """``"module:function"`` every GMI runs, called with its `gmi_drl.gmi.context.GMIContext`"""
    layout: Layout
    """the GMIs, their devices and backend, and the reduction among them"""
    reducer_capacity: Any
    """the most float32 values one reduction of the layout carries (shared-memory sizing), or
    a function that says so where GMI 0 runs (Ray)"""
    tolerate: frozenset[int]
    """GMIs whose failure the run survives (a process placement goes on without them)"""

    def shared(self, payload: Any, placement: str) -> ContextManager[Any]:
        """Make what the GMIs share for ``placement`` (``serial``, ``local`` or ``ray``) and
        give the payload every GMI receives; removes it all on exit."""

    def describe(self, results: list, layout: Layout) -> str:
        """Markdown lines for ``summary.md`` after the GMIs returned ``results``; ``layout``:
        the one the placement ran (Ray's, planned by node)."""


class SyncTemplate:
    """``sync_training``: every GMI runs `gmi_drl.runner.loop.gmi_main` with the run's
    `gmi_drl.runner.loop.LoopSpec`; they share only their gradient reduction."""

    target = SYNC_TARGET
    tolerate: frozenset[int] = frozenset()

    def __init__(self, cfg: TrainConfig, layout: Layout, capacity) -> None:
        self.cfg, self.layout, self.reducer_capacity = cfg, layout, capacity

    @contextlib.contextmanager
    def shared(self, payload: Any, placement: str) -> Iterator[Any]:
        yield payload

    def describe(self, results: list, layout: Layout) -> str:
        return layout.describe() + notes(self.cfg)


def notes(cfg: TrainConfig) -> str:
    """The lines of a reduction through a service: the switch's mode, the parameter server,
    network namespaces."""
    g, text = cfg.gmi, ""
    if g.reduction == "switch":
        how = (f"Async iSwitch, aggregation threshold H = {g.threshold} gradients of any GMIs, "
               f"staleness bound S = {g.staleness} (iSwitch §4.1)" if g.threshold is not None
               else f"stale-sync, staleness bound S = {g.staleness} (iSwitch §4.1)" if g.staleness
               else "synchronous")
        text += f"- gradients reduced through the aggregation switch at {g.switch_addr}, {how}\n"
    if g.reduction == "ps" and g.staleness:
        text += (f"- updates applied asynchronously by the parameter server at {g.ps_addr}, "
                 f"staleness bound S = {g.staleness} (iSwitch's Async PS)\n")
    elif g.reduction == "ps":
        text += f"- gradients reduced through the parameter server at {g.ps_addr}\n"
    if g.netns is not None:
        text += f"- GMI k in network namespace k of {g.netns}\n"
    return text
