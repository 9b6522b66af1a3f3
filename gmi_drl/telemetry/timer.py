"""`timer(name)`: the one way code marks a phase (docs/profiling.md).

Each section feeds a wall-clock timing tree (totals per nested path such as
``"rollout/env_step"``), an optional `Timeline` (Chrome-trace events), and, while a profiler asks
for them, a named range of the same name: an NVTX range (``nvtx`` package; Nsight Systems shows
it) or a ``torch.profiler.record_function`` range (shown in torch profiler traces). The section
class is chosen when the range kind is set, so the disabled features cost nothing per call (no
branch, no import). Each thread has a tree of its own (`set_tree` installs one for the calling
thread; a thread that installed none records into a fresh tree of its own), so GMIs run as
threads of one process (serial placement) time their phases apart.
"""

from __future__ import annotations

import contextlib
import importlib.util
import threading
import time
from typing import Iterator, Literal, NamedTuple

from gmi_drl.telemetry.timeline import Timeline

RangeKind = Literal["none", "nvtx", "torch"]
"""named ranges a timer section also opens: none, NVTX (Nsight Systems), torch.profiler"""


class SectionStats(NamedTuple):
    """Totals of one timer path."""

    total_s: float
    calls: int
    cpu_s: float | None = None
    """CPU seconds of the whole process (every thread) inside the path, or None when the tree
    does not count CPU time"""


class TimingTree:
    """Wall-clock totals per section path; paths nest with ``/`` in the order sections open.

    Args:
        timeline: where every closed section is also recorded, or ``None``.
        ranges: also open a named range per section: ``"nvtx"`` (needs the ``nvtx`` package),
            ``"torch"`` (``torch.profiler.record_function``) or ``"none"``.
        cpu: also total the process's CPU seconds (``time.process_time``: every thread of the
            process, env worker threads included) per path; a system call per section, so only
            measurements that need a phase's resource share (`gmi_drl.tune`) switch it on.

    Raises:
        RuntimeError: ``ranges="nvtx"`` without the ``nvtx`` package.
    """

    def __init__(self, timeline: Timeline | None = None, ranges: RangeKind = "none",
                 cpu: bool = False) -> None:
        self.totals_ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.cpu_ns: dict[str, int] | None = {} if cpu else None
        self.timeline = timeline
        self._stack: list[str] = []
        self.set_ranges(ranges)

    def set_ranges(self, kind: RangeKind) -> None:
        """Open ``kind`` ranges from the next section on (sections already open keep theirs).

        Each kind adds a fixed cost per section, ``torch`` the most, so profilers switch ``torch``
        on only while they capture (``benchmarks/profile_overhead.py`` measures the costs).

        Raises:
            RuntimeError: ``"nvtx"`` without the ``nvtx`` package. ValueError: unknown kind.
        """
        if kind not in _SECTION_CLASSES:
            raise ValueError(f"range kind {kind!r} must be one of {list(_SECTION_CLASSES)}")
        if kind == "nvtx":
            if importlib.util.find_spec("nvtx") is None:
                raise RuntimeError("NVTX ranges requested but the 'nvtx' package is not installed")
            global _nvtx_push, _nvtx_pop
            import nvtx

            _nvtx_push, _nvtx_pop = nvtx.push_range, nvtx.pop_range
        self.ranges = kind
        self.section_class = _SECTION_CLASSES[kind]

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
        cpu = self.cpu_ns
        return {p: SectionStats(self.totals_ns[p] * 1e-9, self.calls[p],
                                None if cpu is None else cpu.get(p, 0) * 1e-9) for p in ordered}

    @contextlib.contextmanager
    def iteration(self, index: int) -> Iterator[None]:
        """``with tree.iteration(k): ...`` around training iteration ``k`` (collect + update)
        records it in the timeline (`Timeline.add_iteration`): its span and the seconds of every
        section path that closed inside it. Nothing is recorded without a timeline, or when the
        block raises."""
        if self.timeline is None:
            yield
            return
        before, start = dict(self.totals_ns), time.perf_counter_ns()
        yield
        dur = time.perf_counter_ns() - start
        phases = {p: round((ns - before.get(p, 0)) * 1e-9, 7)
                  for p, ns in self.totals_ns.items() if ns != before.get(p, 0)}
        self.timeline.add_iteration(index, start, dur, phases)

    def snapshot_s(self) -> dict[str, float]:
        """``{path: total seconds so far}``; subtract two snapshots for the time of an interval."""
        return {p: ns * 1e-9 for p, ns in self.totals_ns.items()}

    def snapshot_cpu_s(self) -> dict[str, float]:
        """``{path: process CPU seconds so far}`` (empty unless the tree counts CPU time)."""
        return {p: ns * 1e-9 for p, ns in (self.cpu_ns or {}).items()}


class _Section:
    __slots__ = ("tree", "name", "path", "start", "cpu_start")

    def __init__(self, tree: TimingTree, name: str) -> None:
        self.tree, self.name = tree, name

    def __enter__(self) -> "_Section":
        stack = self.tree._stack
        self.path = f"{stack[-1]}/{self.name}" if stack else self.name
        stack.append(self.path)
        if self.tree.cpu_ns is not None:
            self.cpu_start = time.process_time_ns()
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc) -> None:
        dur = time.perf_counter_ns() - self.start
        tree = self.tree
        tree._stack.pop()
        path = self.path
        tree.totals_ns[path] = tree.totals_ns.get(path, 0) + dur
        tree.calls[path] = tree.calls.get(path, 0) + 1
        if tree.cpu_ns is not None:
            tree.cpu_ns[path] = tree.cpu_ns.get(path, 0) + time.process_time_ns() - self.cpu_start
        if tree.timeline is not None:
            tree.timeline.add(path, self.start, dur, len(tree._stack) + 1)


_nvtx_push = _nvtx_pop = None  # nvtx.push_range / pop_range, bound by set_ranges("nvtx")


class _NvtxSection(_Section):
    __slots__ = ()

    def __enter__(self) -> "_Section":
        _nvtx_push(self.name)
        return _Section.__enter__(self)

    def __exit__(self, *exc) -> None:
        _Section.__exit__(self, *exc)
        _nvtx_pop()


class _TorchRangeSection(_Section):
    __slots__ = ("range",)

    def __enter__(self) -> "_Section":
        from torch.profiler import record_function

        self.range = record_function(self.name)
        self.range.__enter__()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.range.__exit__(*exc)


_SECTION_CLASSES = {"none": _Section, "nvtx": _NvtxSection, "torch": _TorchRangeSection}

class _Trees(threading.local):
    tree: TimingTree

    def __init__(self) -> None:
        self.tree = TimingTree()


_trees = _Trees()


def set_tree(tree: TimingTree) -> TimingTree:
    """Install ``tree`` as the calling thread's timing tree; returns the previous one."""
    previous, _trees.tree = _trees.tree, tree
    return previous


def get_tree() -> TimingTree:
    """The calling thread's current timing tree."""
    return _trees.tree


def timer(name: str) -> _Section:
    """``with timer("env_step"): ...`` times the block under the enclosing sections' path, in
    the calling thread's tree.

    ``name`` must not contain ``/`` (nesting makes the path).
    """
    tree = _trees.tree
    return tree.section_class(tree, name)
