"""Profiling: which iterations, GMIs and roles are captured, and the tools that capture them.

Source: the Nsight-on-Ray article (Nsight Systems on Ray, as built into verl): a
profiler abstraction with a no-op implementation; capture ranges (``cudaProfilerStart/Stop``)
chosen by training step (here: iteration), by rank and by task, optionally one per task
("discrete"); NVTX ranges fused with the timing function; one ``runtime_env={"nsight": ...}``
per Ray actor instance; the controller says where it runs. docs/profiling.md.

Terms. An *iteration* is one collect + update of the training loop; its index is 0-based and
counted over the whole run (a resumed run continues the count). A *rank* is a GMI id. A *phase*
is a top-level timer section of the training loop; `PHASE_ROLES` says which roles' work it is:

- ``rollout``: simulator and agent. A holistic GMI (GMI-DRL §5.1, TCG_EX) alternates env steps
  (simulator, ``rollout/env_step``) and policy inference (agent, ``rollout/inference``) at every
  env step, so both roles select the one phase; their NVTX ranges tell them apart inside it.
- ``advantages``, ``update``, ``log``, ``checkpoint``: trainer. GAE, the SGD epochs (gradient
  steps: ``forward``/``backward`` or ``compiled_grad``, ``allreduce``, ``optimizer``; or one
  ``compiled_step``) and the trainer's bookkeeping.

A capture range covers consecutive selected phases of a selected iteration (one report per
iteration), or, with ``discrete``, a single selected phase (one report per phase).

Tools: ``none`` (`NoOpProfiler`); ``nsys``: an NVTX range per timer section for the whole run of
a profiled GMI, and ``cudaProfilerStart/Stop`` around its capture ranges, which Nsight Systems
records when the process runs under ``nsys profile --capture-range=cudaProfilerApi`` (built by
`nsys_command` for local GMIs and by `nsight_runtime_env` for Ray actors); ``torch``: a
``torch.profiler`` session per capture range, exported as a Chrome trace, with every timer
section a ``record_function`` range while it records. Without ``nsys`` or CUDA a warning says so
and only the built-in ``timeline.json`` is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ContextManager, Iterator, Literal, Protocol

from gmi_drl.files import write_text_atomically
from gmi_drl.telemetry.timer import TimingTree, timer

log = logging.getLogger(__name__)

Role = Literal["simulator", "agent", "trainer"]
ROLES: tuple[Role, ...] = ("simulator", "agent", "trainer")
PHASE_ROLES: dict[str, tuple[Role, ...]] = {
    "rollout": ("simulator", "agent"), "advantages": ("trainer",), "update": ("trainer",),
    "log": ("trainer",), "checkpoint": ("trainer",)}
"""roles whose work each top-level phase of the training loop is (see the module docstring)"""

NSYS_OPTIONS = {"trace": "cuda,nvtx,osrt", "capture-range": "cudaProfilerApi",
                "capture-range-end": "repeat"}
"""``nsys profile`` options of every profiled GMI: CUDA API and kernels, NVTX ranges and OS
runtime calls, recorded only between ``cudaProfilerStart`` and ``cudaProfilerStop``; ``repeat``:
each capture range becomes its own numbered report"""


@dataclass
class ProfilerConfig:
    """Profiling (docs/profiling.md): which tool captures which iterations, GMIs (ranks) and
    roles."""

    tool: Literal["none", "nsys", "torch"] = "none"
    """none; nsys: Nsight Systems capture ranges and NVTX ranges (GMIs run under nsys where it is
    on PATH and NVML sees a GPU); torch: torch.profiler Chrome traces in RUN_DIR/profile/gmi-<k>/"""
    iterations: list[int] = field(default_factory=lambda: [1])
    """iterations (0-based collect + update indices of the whole run) to capture; default: the
    second, after warm-up"""
    ranks: list[int] = field(default_factory=lambda: [0])
    """GMI ids to profile (ignored with all_ranks)"""
    all_ranks: bool = False
    """profile every GMI"""
    roles: list[Role] = field(default_factory=lambda: list(ROLES))
    """roles whose phases are captured: simulator and agent select rollout; trainer selects
    advantages, update, log and checkpoint"""
    discrete: bool = False
    """one capture range (one report) per phase instead of one per iteration"""
    nvtx: bool = True
    """with nsys: an NVTX range per timer section, for the whole run of a profiled GMI"""


def rank_selected(cfg: ProfilerConfig, rank: int) -> bool:
    """Whether GMI ``rank`` is profiled at all (``tool`` is not none and the rank is chosen)."""
    return cfg.tool != "none" and (cfg.all_ranks or rank in cfg.ranks)


def should_capture(cfg: ProfilerConfig, iteration: int, rank: int, role: str) -> bool:
    """Whether ``role``'s work in iteration ``iteration`` of GMI ``rank`` falls in a capture range.

    Raises:
        ValueError: ``role`` is not one of `ROLES`.
    """
    if role not in ROLES:
        raise ValueError(f"role {role!r} must be one of {list(ROLES)}")
    return rank_selected(cfg, rank) and iteration in cfg.iterations and role in cfg.roles


def phase_roles(phase: str) -> tuple[Role, ...]:
    """The roles of top-level phase ``phase`` (`PHASE_ROLES`).

    Raises:
        ValueError: an unknown phase (a new top-level section needs its roles in `PHASE_ROLES`).
    """
    try:
        return PHASE_ROLES[phase]
    except KeyError:
        raise ValueError(f"phase {phase!r} has no roles; add it to PHASE_ROLES "
                         f"(known: {list(PHASE_ROLES)})") from None


class Profiler(Protocol):
    """What the training loop calls: ``with prof.iteration(k):`` around iteration ``k`` and
    ``with prof.phase(name):`` around each top-level phase (a `timer` section of that name)."""

    def iteration(self, index: int) -> ContextManager[None]: ...

    def phase(self, name: str) -> ContextManager: ...

    def close(self) -> None: ...


class NoOpProfiler:
    """Profiling off (or not for this GMI): `phase` is exactly ``timer(name)``, `iteration` a shared
    null context; nothing else happens."""

    _null = contextlib.nullcontext()

    def iteration(self, index: int) -> ContextManager[None]:
        return self._null

    def phase(self, name: str) -> ContextManager:
        return timer(name)

    def close(self) -> None:
        pass


class Capture(Protocol):
    """A tool's capture range: `start` opens one (labelled), `stop` closes it."""

    def start(self, label: str) -> None: ...

    def stop(self) -> None: ...


class CudaCapture:
    """``cudaProfilerStart/Stop`` (``torch.cuda.profiler``), which ``nsys profile
    --capture-range=cudaProfilerApi`` records between (without nsys attached they cost a driver
    call). The device is synchronised at both ends so a range holds exactly its GPU work, and an
    NVTX range named after the capture's label (``iteration-3``) spans it."""

    def start(self, label: str) -> None:
        import nvtx
        import torch

        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        nvtx.push_range(label)

    def stop(self) -> None:
        import nvtx
        import torch

        torch.cuda.synchronize()
        nvtx.pop_range()
        torch.cuda.profiler.stop()


class TorchCapture:
    """A ``torch.profiler`` session per capture range (CPU ops, and CUDA kernels where CUDA is
    available), exported to ``<out_dir>/torch-<label>.json`` (Chrome trace; open in
    https://ui.perfetto.dev). While it records, every timer section is a ``record_function`` range,
    so the trace shows the phases.

    Args:
        out_dir: where the traces go (created). tree: the process's timing tree.
    """

    def __init__(self, out_dir: Path, tree: TimingTree) -> None:
        self.out_dir, self.tree = Path(out_dir), tree
        self.files: list[Path] = []
        self._session = None

    def start(self, label: str) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._session = profile(activities=activities)
        self._label, self._ranges = label, self.tree.ranges
        self._session.__enter__()
        self.tree.set_ranges("torch")

    def stop(self) -> None:
        self.tree.set_ranges(self._ranges)
        self._session.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"torch-{self._label}.json"
        self._session.export_chrome_trace(str(path))
        self.files.append(path)
        self._session = None


class CaptureProfiler:
    """Opens and closes capture ranges of ``capture`` around the selected iterations and phases of
    GMI ``rank`` (selection: `should_capture`; grouping: the module docstring). Writes
    ``<out_dir>/captures.json`` on `close`: one entry per range, in order (``index`` from 1, the
    numbering of nsys's reports), with its label, iteration, phases, Unix start time and duration.

    Args:
        cfg: what to capture. rank: this GMI's id. capture: the tool. out_dir: this GMI's
            profile directory (``RUN_DIR/profile/gmi-<k>``).
    """

    def __init__(self, cfg: ProfilerConfig, rank: int, capture: Capture, out_dir: Path) -> None:
        self.cfg, self.rank, self.capture, self.out_dir = cfg, rank, capture, Path(out_dir)
        self.captures: list[dict] = []
        self._iteration: int | None = None
        self._open: dict | None = None
        self._ranges_this_iteration = 0
        self._seen: list[int] = []

    @contextlib.contextmanager
    def iteration(self, index: int) -> Iterator[None]:
        self._iteration, self._ranges_this_iteration = index, 0
        self._seen.append(index)
        try:
            yield
        finally:
            self._stop()
            self._iteration = None

    def phase(self, name: str) -> ContextManager:
        k = self._iteration
        if k is None or not any(should_capture(self.cfg, k, self.rank, r)
                                   for r in phase_roles(name)):
            self._stop()  # an unselected phase ends the range
            return timer(name)
        return self._captured(name, k)

    @contextlib.contextmanager
    def _captured(self, name: str, k: int) -> Iterator[None]:
        if self._open is None:
            first = not self.cfg.discrete and self._ranges_this_iteration == 0
            self._start(f"iteration-{k}" if first else f"iteration-{k}-{name}", k)
        self._open["phases"].append(name)
        try:
            with timer(name):
                yield
        finally:
            if self.cfg.discrete:
                self._stop()

    def _start(self, label: str, k: int) -> None:
        self._ranges_this_iteration += 1
        entry = {"index": len(self.captures) + 1, "label": label, "iteration": k,
                 "phases": [], "start_unix_s": time.time()}
        self.capture.start(label)  # (a tool that fails to start leaves no range open)
        self._open = dict(entry, t0=time.perf_counter())  # the range's time, not the tool's

    def _stop(self) -> None:
        if self._open is None:
            return
        entry, self._open = self._open, None
        entry["dur_s"] = round(time.perf_counter() - entry.pop("t0"), 6)
        self.capture.stop()
        self.captures.append(entry)

    def close(self) -> None:
        """Close an open range (a run that raised mid-iteration) and write ``captures.json``;
        warn when no selected iteration ran in this process."""
        self._stop()
        if self.captures:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomically(self.out_dir / "captures.json",
                                  json.dumps(self.captures, indent=1) + "\n")
        elif self._seen:
            log.warning("profiling: GMI %d captured nothing: profile.iterations %s are not "
                        "among the iterations %d..%d this process ran", self.rank,
                        self.cfg.iterations, self._seen[0], self._seen[-1])


def make_profiler(cfg: ProfilerConfig, rank: int, out_dir: Path, tree: TimingTree) -> Profiler:
    """The profiler of GMI ``rank``; switches ``tree``'s NVTX ranges on for a profiled nsys GMI.

    A `NoOpProfiler` when the tool is none or the rank not selected, and, with a warning, for
    nsys without a CUDA device in this process (capture ranges need CUDA; NVTX ranges stay on,
    so a CPU-only ``nsys profile`` still shows the phases). Without the ``nvtx`` package a
    warning replaces the NVTX ranges.
    """
    if not rank_selected(cfg, rank):
        return NoOpProfiler()
    if cfg.tool == "torch":
        return CaptureProfiler(cfg, rank, TorchCapture(out_dir, tree), out_dir)
    if cfg.nvtx:
        try:
            tree.set_ranges("nvtx")
        except RuntimeError as e:
            log.warning("profiling: GMI %d: %s; no NVTX ranges", rank, e)
    import torch

    if not torch.cuda.is_available():
        log.warning("profiling: GMI %d: profile.tool nsys needs a CUDA device for its capture "
                    "ranges and torch sees none; no capture (NVTX ranges %s), the built-in "
                    "timeline.json as always", rank, "on" if cfg.nvtx else "off")
        return NoOpProfiler()
    return CaptureProfiler(cfg, rank, CudaCapture(), out_dir)


def find_nsys() -> str | None:
    """Absolute path of ``nsys`` on PATH, or ``None``."""
    return shutil.which("nsys")


def nsys_command(cfg: ProfilerConfig, gmi_id: int, run_dir: str | Path) -> list[str] | None:
    """The command prefix that runs local GMI ``gmi_id``'s Python under Nsight Systems.

    ``[nsys, "profile", --trace=cuda,nvtx,osrt, --capture-range=cudaProfilerApi,
    --capture-range-end=repeat, --output=RUN_DIR/profile/gmi-<k>/gmi-<k>-%p]`` (every option in
    ``--name=value`` form; nsys expands ``%p`` to the pid and numbers one report per capture
    range; it does not create the directory: the caller does). ``None`` when the tool is not
    nsys or the GMI is not selected, and ``None`` with a logged warning when ``nsys`` is not on
    PATH.
    """
    if cfg.tool != "nsys" or not rank_selected(cfg, gmi_id):
        return None
    nsys = find_nsys()
    if nsys is None:
        log.warning("profiling: nsys is not on PATH: GMI %d runs without Nsight Systems; only the "
                    "built-in timeline.json is written", gmi_id)
        return None
    out = Path(run_dir).resolve() / "profile" / f"gmi-{gmi_id}" / f"gmi-{gmi_id}-%p"
    return [nsys, "profile", *(f"--{k}={v}" for k, v in NSYS_OPTIONS.items()), f"--output={out}"]


def nsight_runtime_env(cfg: ProfilerConfig, gmi_id: int, run_dir: str | Path) -> dict | None:
    """The Ray ``runtime_env`` that runs the actor of GMI ``gmi_id`` under Nsight Systems.

    ``{"nsight": {"trace": ..., "capture-range": "cudaProfilerApi", "capture-range-end":
    "repeat", "o": "<run name>-gmi-<k>-%p"}}``, for ``Actor.options(runtime_env=...)`` per actor
    instance (the Nsight-on-Ray article). Ray turns each key into ``--key=value`` and writes the
    reports under ``/tmp/ray/session_*/logs/nsight/`` on the actor's node (``o`` is the name
    there). ``None`` when the tool is not nsys or the GMI is not selected, and ``None`` with a
    logged warning when ``nsys`` is not on this host's PATH.
    """
    if cfg.tool != "nsys" or not rank_selected(cfg, gmi_id):
        return None
    if find_nsys() is None:
        log.warning("profiling: nsys is not on PATH: the Ray actor of GMI %d runs without "
                    "Nsight Systems; only the built-in timeline.json is written", gmi_id)
        return None
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(run_dir).resolve().name)
    return {"nsight": {**NSYS_OPTIONS, "o": f"{name}-gmi-{gmi_id}-%p"}}


def list_reports(run_dir: str | Path) -> list[Path]:
    """Every profiling output under ``run_dir``: timelines, ``gpu_util.csv``, and everything in
    ``profile/`` (nsys reports, torch traces, ``captures.json``, the merged report)."""
    run_dir = Path(run_dir)
    found = [run_dir / "timeline.json", *sorted(run_dir.glob("gmi-*/timeline.json")),
             run_dir / "gpu_util.csv"]
    found += sorted(p for p in (run_dir / "profile").rglob("*") if p.is_file())
    return [p for p in found if p.exists()]
