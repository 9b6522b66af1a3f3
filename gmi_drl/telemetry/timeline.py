"""Chrome-trace timeline of timer sections (open ``timeline.json`` in https://ui.perfetto.dev)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path


class Timeline:
    """Complete (``"ph": "X"``) trace events of closed timer sections.

    Top-level sections (depth 1: rollout, update, ...) are always kept, so the whole run's phases
    are visible; deeper sections (per-step ``rollout/env_step`` ...) are kept until
    ``max_detail_events`` of them were recorded, which bounds the file (~100 bytes per event).

    Args:
        max_detail_events: budget of events at depth >= 2.
        process_name: shown as the process track's name.
    """

    def __init__(self, max_detail_events: int = 20_000, process_name: str = "trainer") -> None:
        self.events: list[tuple[str, int, int]] = []
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

    def write(self, path: str | Path) -> None:
        """Write the Chrome-trace JSON file (atomic: temporary file, then rename)."""
        pid, tid = os.getpid(), threading.get_native_id()
        events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": tid,
                   "args": {"name": self.process_name}}]
        events += [{"name": p.rsplit("/", 1)[-1], "cat": p, "ph": "X", "pid": pid, "tid": tid,
                    "ts": s / 1000.0, "dur": d / 1000.0} for p, s, d in self.events]
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"dropped_detail_events": self.dropped}}
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
