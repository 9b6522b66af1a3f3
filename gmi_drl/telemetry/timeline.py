"""Chrome-trace timeline of timer sections (open ``timeline.json`` in https://ui.perfetto.dev)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from gmi_drl.files import write_text_atomically

ITERATION_TID = 0
"""thread id of the per-iteration track (real threads have native ids > 0)"""


class Timeline:
    """Complete (``"ph": "X"``) trace events of closed timer sections.

    Top-level sections (depth 1: rollout, update, ...) are always kept, so the whole run's phases
    are visible; deeper sections (per-step ``rollout/env_step`` ...) are kept until
    ``max_detail_events`` of them were recorded, which bounds the file's size.
    One event per training iteration (`add_iteration`) carries that iteration's
    seconds per section path, so per-iteration breakdowns survive the detail budget.

    Args:
        max_detail_events: budget of events at depth >= 2.
        process_name: shown as the process track's name.
    """

    def __init__(self, max_detail_events: int = 20_000, process_name: str = "trainer") -> None:
        self.events: list[tuple[str, int, int]] = []
        self.iterations: list[tuple[int, int, int, dict[str, float]]] = []
        self.max_detail_events = max_detail_events
        self.detail_events = 0
        self.dropped = 0
        self.process_name = process_name

    def add(self, path: str, start_ns: int, dur_ns: int, depth: int) -> None:
        """Record a section that started at ``start_ns`` (``time.perf_counter_ns``) and lasted
        ``dur_ns``, nested ``depth`` deep (1 = top level)."""
        if depth > 1:
            if self.detail_events >= self.max_detail_events:
                self.dropped += 1
                return
            self.detail_events += 1
        self.events.append((path, start_ns, dur_ns))

    def add_iteration(self, index: int, start_ns: int, dur_ns: int,
                      phases_s: dict[str, float]) -> None:
        """Record training iteration ``index`` (the PPO update count): its start
        (``time.perf_counter_ns``), duration, and seconds spent per section path in it
        (``{"rollout": 0.8, "update/allreduce": 0.02, ...}``)."""
        self.iterations.append((index, start_ns, dur_ns, phases_s))

    def write(self, path: str | Path) -> None:
        """Write the Chrome-trace JSON file (atomic: temporary file, then rename).

        ``ts``/``dur`` are microseconds of this process's ``time.perf_counter`` (one clock for all
        processes of a Linux host); ``otherData.clock`` pairs one reading of it with Unix time so
        timelines of several hosts can be merged (`gmi_drl.telemetry.report`). Iterations are
        ``"cat": "iteration"`` events on thread `ITERATION_TID` with ``args.phases_s``.
        """
        pid, tid = os.getpid(), threading.get_native_id()
        events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": tid,
                   "args": {"name": self.process_name}},
                  {"name": "thread_name", "ph": "M", "pid": pid, "tid": ITERATION_TID,
                   "args": {"name": "iterations"}}]
        events += [{"name": p.rsplit("/", 1)[-1], "cat": p, "ph": "X", "pid": pid, "tid": tid,
                    "ts": s / 1000.0, "dur": d / 1000.0} for p, s, d in self.events]
        events += [{"name": f"iteration {k}", "cat": "iteration", "ph": "X", "pid": pid,
                    "tid": ITERATION_TID, "ts": s / 1000.0, "dur": d / 1000.0,
                    "args": {"iteration": k, "phases_s": phases}}
                   for k, s, d, phases in self.iterations]
        perf_ns, unix_ns = time.perf_counter_ns(), time.time_ns()
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"dropped_detail_events": self.dropped, "host": socket.gethostname(),
                             "pid": pid, "process_name": self.process_name,
                             "clock": {"perf_counter_us": perf_ns / 1000.0,
                                       "unix_us": unix_ns / 1000.0}}}
        write_text_atomically(path, json.dumps(doc))
