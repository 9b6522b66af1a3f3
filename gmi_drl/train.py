"""``train(cfg)``: one run, from a config to its directory. The run, the placement and the loop.

The controller validates the config, resolves the run (`gmi_drl.runner.run.Run`: directory,
config.json, checkpoints, summary.md), chooses the placement (`gmi_drl.runner.placement`: serial
threads, local processes or Ray actors) and has it run `gmi_drl.runner.loop.gmi_main` once per
GMI; GMI 0's result and the placement's description make ``summary.md``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from gmi_drl import blocks
from gmi_drl.checkpoint import list_checkpoints
from gmi_drl.comm.switch.client import SwitchError
from gmi_drl.config import ConfigError, TrainConfig, validate
from gmi_drl.envs.workers import EnvWorkerError
from gmi_drl.errors import TrainingDiverged, out_of_memory
from gmi_drl.files import replace_atomically
from gmi_drl.gmi.launcher import GMIError
from gmi_drl.runner.loop import LoopResult, LoopSpec
from gmi_drl.runner.placement import make_placement
from gmi_drl.runner.preflight import build_on_cpu, preflight
from gmi_drl.runner.run import Run, RunStopped
from gmi_drl.telemetry.progress import Progress

log = logging.getLogger(__name__)

TARGET = "gmi_drl.runner.loop:gmi_main"
"""the GMI target every placement runs"""

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


def train(cfg: TrainConfig, on_progress: Callable[[Progress], None] | None = None) -> TrainResult:
    """Train ``cfg.algo`` on ``cfg.env.task_id`` for ``cfg.num_iterations`` iterations; blocks.

    Writes the run directory (config.json, metrics.csv, TensorBoard events, checkpoints/,
    timeline.json, summary.md, learning_curve.png; gpu_util.csv where NVML sees a GPU; with
    ``profile.tool`` set, profile/ with the tool's reports and the merged report of
    `gmi_drl.telemetry.report`). ``on_progress`` gets GMI 0's `Progress` every
    ``log.log_every`` iterations, in this process: from GMI 0's thread where GMI 0 runs here
    (the caller's thread for a lone GMI; an exception from it stops the run), from a thread of
    its own where GMI 0 runs in a process of this machine (an exception is logged and it is not
    called again). On Ray it is not called (GMI 0 may run on another host): GMI 0 prints the
    progress line instead.

    Raises:
        ConfigError: invalid config (every field named), a task the algorithm cannot run or
            a size that does not fit in memory (`preflight`), a resume the checkpoint cannot
            serve (`check_resumable`), or a run directory another process is using; raised
            before the run directory is written (a ``checkpoints/`` that cannot be written:
            just after it is made, before any GMI starts).
        CheckpointError: the ``--resume`` checkpoint is missing or corrupt (before the run
            starts), or its weights do not fit this run (after it started).
        RunStopped: the run started and stopped on an expected failure (`STOPS`, or memory
            running out), its cause chained; any other exception leaves as it is. Either way
            its traceback is in ``RUN_DIR/train.log``.
    """
    validate(cfg)
    algo = preflight(cfg)
    placement = make_placement(cfg, _reduced_floats(cfg, algo))
    run = Run.create(cfg, algo)
    del algo
    try:
        with run.claimed(), run.log_file():
            before = _resumed_state(run)
            run.start()
            try:
                _reclaim_shared_memory()
                with run.telemetry():
                    results = placement.launch(TARGET, LoopSpec(run, on_progress))
            except BaseException as e:
                _undo_config_json(run, before, e)
                raise
    except STOPS as e:
        raise RunStopped(run, e) from e
    except (MemoryError, RuntimeError) as e:  # (torch's allocators raise RuntimeErrors)
        if not out_of_memory(e):
            raise
        raise RunStopped(run, e) from e
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


class _Before(NamedTuple):
    """A resumed run's directory before an attempt: config.json's bytes (``None``: there was
    none) and each checkpoint's ``(mtime_ns, size)`` by name."""

    config: bytes | None
    checkpoints: dict[str, tuple[int, int]]


def _checkpoint_marks(run: Run) -> dict[str, tuple[int, int]]:
    marks = {}
    for path in list_checkpoints(run.run_dir):
        try:
            st = path.stat()
        except OSError:  # pruned meanwhile
            continue
        marks[path.name] = (st.st_mtime_ns, st.st_size)
    return marks


def _resumed_state(run: Run) -> _Before | None:
    """What `_undo_config_json` puts back; ``None`` for a fresh start."""
    if run.resume_from is None:
        return None
    path = run.run_dir / "config.json"
    try:
        config = path.read_bytes()
    except OSError:
        config = None
    return _Before(config, _checkpoint_marks(run))


def _undo_config_json(run: Run, before: _Before | None, error: BaseException) -> None:
    """A resumed attempt whose config could not start (a `ConfigError` or a `PlacementError`
    at launch: a Ray address where no cluster listens, say) and that wrote no checkpoint puts
    ``config.json`` back as it was, or removes it where there was none: the next plain
    ``--resume`` would otherwise read the failed flags as the run's edited config. Any other
    stop (Ctrl-C, a crash, out of memory) keeps the attempt's config.json."""
    ray_launcher = sys.modules.get("gmi_drl.cluster.ray_launcher")  # (imported where used)
    unstartable = (ConfigError,) + ((ray_launcher.PlacementError,) if ray_launcher else ())
    if (before is None or not isinstance(error, unstartable)
            or _checkpoint_marks(run) != before.checkpoints):
        return
    path = run.run_dir / "config.json"
    try:
        if before.config is None:
            path.unlink(missing_ok=True)
        else:
            replace_atomically(path, lambda tmp: tmp.write_bytes(before.config))
    except OSError as e:  # (the attempt's own error is the one to raise)
        log.warning("could not put %s back as it was before this attempt: %s", path, e)
        return
    log.warning("%s is back as it was before this attempt, which could not start (the flags "
                "given to it are not kept)", path)


def _reduced_floats(cfg: TrainConfig, algo=None) -> int:
    """The most float32 values one allreduce of the run carries: every weight the algorithm
    trains (`weight_count`, of ``algo`` where given), or 1 when no GMI shares memory with
    another."""
    if cfg.num_trainers == 1 or cfg.gmi.reduction not in ("auto", "mpr", "har"):
        return 1
    return weight_count(cfg, algo)


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
