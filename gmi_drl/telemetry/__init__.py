"""Timing tree, timeline, metric sinks, console progress and run summaries."""

from gmi_drl.telemetry.timeline import Timeline
from gmi_drl.telemetry.timer import TimingTree, get_tree, set_tree, timer

__all__ = ["Timeline", "TimingTree", "get_tree", "set_tree", "timer"]
