"""`timer(name)`: the one way code marks a phase (DESIGN.md §7).

Each section feeds a wall-clock timing tree (totals per nested path such as
``"rollout/env_step"``), an optional `Timeline` (Chrome-trace events), and, when NVTX profiling is
switched on and the ``nvtx`` package exists, an NVTX range of the same name. The section class is
chosen once, when a tree is installed, so the disabled features cost nothing per call (no branch,
no import). Not thread-safe: one tree per thread of control (one per process today).
"""

from __future__ import annotations

import importlib.util
import time
from typing import NamedTuple

from gmi_drl.telemetry.timeline import Timeline


class SectionStats(NamedTuple):
    """Totals of one timer path."""

    total_s: float
    calls: int


class TimingTree:
    """Wall-clock totals per section path; paths nest with ``/`` in the order sections open.

    Args:
        timeline: where every closed section is also recorded, or ``None``.
        nvtx: open an NVTX range per section (needs the ``nvtx`` package).

    Raises:
        RuntimeError: ``nvtx=True`` without the ``nvtx`` package.
    """

    def __init__(self, timeline: Timeline | None = None, nvtx: bool = False) -> None:
        self.totals_ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.timeline = timeline
        self._stack: list[str] = []
        if nvtx and importlib.util.find_spec("nvtx") is None:
            raise RuntimeError("NVTX ranges requested but the 'nvtx' package is not installed")
        self.section_class = _NvtxSection if nvtx else _Section

    def stats(self) -> dict[str, SectionStats]:
        """``{path: SectionStats}`` in tree order: each parent before its children, siblings in
        the order they first closed."""
        children: dict[str, list[str]] = {}
        for path in self.totals_ns:
            parent = path.rpartition("/")[0]
            children.setdefault(parent if parent in self.totals_ns else "", []).append(path)
        ordered: list[str] = []
        stack = list(reversed(children.get("", [])))
        while stack:
            path = stack.pop()
            ordered.append(path)
            stack.extend(reversed(children.get(path, [])))
        return {p: SectionStats(self.totals_ns[p] * 1e-9, self.calls[p]) for p in ordered}

    def snapshot_s(self) -> dict[str, float]:
        """``{path: total seconds so far}``; subtract two snapshots for the time of an interval."""
        return {p: ns * 1e-9 for p, ns in self.totals_ns.items()}


class _Section:
    __slots__ = ("tree", "name", "path", "start")

    def __init__(self, tree: TimingTree, name: str) -> None:
        self.tree, self.name = tree, name

    def __enter__(self) -> "_Section":
        stack = self.tree._stack
        self.path = f"{stack[-1]}/{self.name}" if stack else self.name
        stack.append(self.path)
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc) -> None:
        dur = time.perf_counter_ns() - self.start
        tree = self.tree
        tree._stack.pop()
        path = self.path
        tree.totals_ns[path] = tree.totals_ns.get(path, 0) + dur
        tree.calls[path] = tree.calls.get(path, 0) + 1
        if tree.timeline is not None:
            tree.timeline.add(path, self.start, dur, len(tree._stack) + 1)


class _NvtxSection(_Section):
    __slots__ = ()

    def __enter__(self) -> "_Section":
        import nvtx

        nvtx.push_range(self.name)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        import nvtx

        super().__exit__(*exc)
        nvtx.pop_range()


_tree = TimingTree()


def set_tree(tree: TimingTree) -> TimingTree:
    """Install ``tree`` as the process's timing tree; returns the previous one."""
    global _tree
    previous, _tree = _tree, tree
    return previous


def get_tree() -> TimingTree:
    """The process's current timing tree."""
    return _tree


def timer(name: str) -> _Section:
    """``with timer("env_step"): ...`` times the block under the enclosing sections' path.

    ``name`` must not contain ``/`` (nesting makes the path). Cost: ~1 us per section.
    """
    return _tree.section_class(_tree, name)
