"""``train(cfg)``: one run, from a config to its directory. The run, the placement and the loop.

The controller validates the config, resolves the run (`gmi_drl.runner.run.Run`: directory,
config.json, checkpoints, summary.md), chooses the placement (`gmi_drl.runner.placement`: serial
threads, local processes or Ray actors) and has it run `gmi_drl.runner.loop.gmi_main` once per
GMI; GMI 0's result and the placement's description make ``summary.md``.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from gmi_drl import blocks
from gmi_drl.comm.switch.client import SwitchError
from gmi_drl.config import TrainConfig, validate
from gmi_drl.envs.workers import EnvWorkerError
from gmi_drl.errors import TrainingDiverged, out_of_memory
from gmi_drl.gmi.launcher import GMIError
from gmi_drl.runner.loop import LoopSpec
from gmi_drl.runner.shell import LoopResult
from gmi_drl.runner.placement import make_placement
from gmi_drl.runner.preflight import build_on_cpu, preflight
from gmi_drl.runner.resume import Resume
from gmi_drl.runner.run import Run, RunStopped
from gmi_drl.telemetry.progress import Progress

log = logging.getLogger(__name__)

STOPS = (GMIError, EnvWorkerError, SwitchError, TrainingDiverged, KeyboardInterrupt)
"""the failures a started run expects (a GMI or env worker that dies, hangs or raises, a switch
that does not answer, weights gone NaN, Ctrl-C): `train` raises them as `RunStopped`"""


class TrainResult(NamedTuple):
    """What `train` returns (GMI 0's figures)."""

    run_dir: Path
    global_step: int
    """env steps over every env and GMI at the end: ``total_timesteps`` rounded down to whole
    iterations (async: samples the trainer GMIs trained on)"""
    wall_s: float
    """seconds in the loop (setup excluded)"""
    episode_steps: np.ndarray
    """``(k,) int64`` global_step at the end of the iteration in which each episode finished"""
    episode_returns: np.ndarray
    """``(k,) float64`` undiscounted return of each episode"""
    episode_wall_s: np.ndarray
    """``(k,) float64`` loop seconds at that point (0 = start of this call's loop, and for the
    episodes restored from before a resume)"""
    weight_digests: tuple[str, ...]
    """per GMI (async: per trainer GMI), a sha256 chained over its weights after every logged
    update of this call (every ``log.log_every`` iterations and the last): equal on all GMIs
    iff their weights were identical then"""
    peak_memory_bytes: tuple[int, ...] = ()
    """per GMI that returned (async: serving GMIs too), its peak memory on its device, bytes
    (GMI-DRL Algorithm 2's mem)"""
    steady_sps: float = float("nan")
    """global env steps/s after the loop's first iteration, which pays the one-time costs
    (torch.compile); nan for a loop of one iteration"""


def _reclaim_shared_memory() -> None:
    """Unlink what runs killed with SIGKILL as a whole left in /dev/shm (`blocks`)."""
    reclaimed = blocks.reclaim_orphans()
    if reclaimed:
        log.info("unlinked %d shared-memory block(s) that killed runs left in /dev/shm",
                 len(reclaimed))


def train(cfg: TrainConfig, on_progress: Callable[[Progress], None] | None = None, *,
          resume: Resume | None = None) -> TrainResult:
    """Train ``cfg.algo`` on ``cfg.env.task_id`` for ``cfg.num_iterations`` iterations; blocks.

    Writes the run directory (config.json with each checkpoint, metrics.csv, TensorBoard events,
    checkpoints/, timeline.json, summary.md, learning_curve.png; gpu_util.csv where NVML sees a
    GPU; with ``profile.tool`` set, profile/ with the tool's reports and the merged report of
    `gmi_drl.telemetry.report`). ``on_progress`` gets GMI 0's `Progress` every
    ``log.log_every`` iterations, in this process: from GMI 0's thread where GMI 0 runs here
    (the caller's thread for a lone GMI; an exception from it stops the run), from a thread of
    its own where GMI 0 runs in a process of this machine (an exception is logged and it is not
    called again). On Ray it is not called (GMI 0 may run on another host): GMI 0 prints the
    progress line instead. ``resume``: `Resume.find` of ``cfg.resume`` where the caller has
    it (the CLI, which read the config from it); else it is found here.

    Raises:
        InvalidConfig: a field that cannot hold (every one named), before anything else.
        ConfigError: a task the algorithm cannot run or a size that does not fit in memory
            (`preflight`), a resume the checkpoint cannot serve (`Resume.check`), or a run
            directory another process is using; raised before the run directory is written (a
            ``checkpoints/`` that cannot be written: just after it is made, before any GMI
            starts).
        CheckpointError: the ``--resume`` checkpoint is missing or corrupt (before the run
            starts), or its weights do not fit this run (after it started).
        RunStopped: the run started and stopped on an expected failure (`STOPS`, or memory
            running out), its cause chained; any other exception leaves as it is. Either way
            its traceback is in ``RUN_DIR/train.log``.
    """
    validate(cfg)
    resume = _resumed(cfg, resume)
    algo = preflight(cfg)
    if resume is not None:
        resume.check(cfg, algo)
    placement = make_placement(cfg, _reduced_floats(cfg, algo))
    del algo
    run = Run.create(cfg, resume)
    results = _launched(run, placement, on_progress)
    return _summarised(run, placement, results)


def _resumed(cfg: TrainConfig, resume: Resume | None) -> Resume | None:
    """The run ``cfg.resume`` continues, loaded once (``resume`` where the caller loaded it).

    Raises:
        ValueError: ``resume`` given for a config that does not resume, or names another.
    """
    if resume is not None and cfg.resume != resume.asked:
        raise ValueError(f"resume={resume.asked!r} with cfg.resume={cfg.resume!r}: give the "
                         "Resume of the config's own --resume")
    if cfg.resume is None:
        return None
    return resume or Resume.find(cfg.resume)


def _launched(run: Run, placement, on_progress) -> list:
    """The GMIs' results, the run directory held and ``train.log`` written meanwhile.

    Raises:
        RunStopped: what `train` says.
    """
    try:
        with run.claimed(), run.log_file():
            run.start()
            _reclaim_shared_memory()
            with run.telemetry():
                return placement.launch(LoopSpec(run, on_progress))
    except STOPS as e:
        raise RunStopped(run, e) from e
    except (MemoryError, RuntimeError) as e:  # (torch's allocators raise RuntimeErrors)
        if not out_of_memory(e):
            raise
        raise RunStopped(run, e) from e


def _summarised(run: Run, placement, results: list) -> TrainResult:
    """``summary.md`` written from GMI 0's result and the placement's description."""
    memory = tuple(getattr(r, "peak_memory_bytes", 0) for r in results if r is not None)
    results = [r for r in results if isinstance(r, LoopResult)]  # trainers (async: not serving)
    digests = tuple(r.weights_digest for r in results)
    text = placement.describe()
    if len(digests) > 1:
        same = "yes" if len(set(digests)) == 1 else "NO (a bug: please report it)"
        n = run.config.log.log_every
        when = "every update" if n == 1 else f"every {n} updates"
        who = "trainer GMIs" if run.config.is_async else "GMIs"
        text += (f"- weights identical on all {len(digests)} {who} after {when}: {same} "
                 f"(sha256 {digests[0][:16]}...)\n")
    run.write_summary(results[0], text)
    r = results[0]
    return TrainResult(run.run_dir, r.global_step, r.wall_s, r.episode_steps, r.episode_returns,
                       r.episode_wall_s, digests, memory, r.steady_sps)


def _reduced_floats(cfg: TrainConfig, algo=None) -> int | Callable[[], int]:
    """The most float32 values one allreduce of the run carries: every weight the algorithm
    trains (`weight_count` of ``algo``), or 1 when no GMI shares memory with another. Without
    ``algo`` (Ray: this process does not build the task, which may need what only the
    cluster's nodes have), `weight_count` of ``cfg`` to run on the cluster."""
    if cfg.num_trainers == 1 or cfg.gmi.reduction not in ("auto", "mpr", "har"):
        return 1
    return weight_count(cfg, algo) if algo is not None else functools.partial(weight_count, cfg)


def weight_count(cfg: TrainConfig, algo=None) -> int:
    """Float32 weights that ``cfg``'s algorithm trains (``algo``, or built once on the CPU,
    untrained): those of the modules its optimizers are named after, target networks (which
    only copy them) left out; every module where no optimizer names one. ``4 * weight_count``
    is the model size M_p in bytes, what an allreduce of the gradients moves per update."""
    algo = build_on_cpu(cfg) if algo is None else algo
    state = algo.state_dict()
    modules = state["modules"]
    trained = [name for name in state.get("optimizers", {}) if name in modules] or modules
    return sum(t.numel() for name in trained for t in modules[name].values())
