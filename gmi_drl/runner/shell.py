"""The GMI shell: what every GMI that learns holds besides its learner, and its iterations.

A learning GMI is a holistic GMI of the ``sync_training`` template
(`gmi_drl.runner.loop.HolisticGMI`: pool, algorithm, normalisers) or a trainer GMI of the
``async_training`` template (`gmi_drl.runner.async_loop.TrainerGMI`: learner, batcher, weight
store). Both are a `GMIShell`: the run and its checkpoint to resume from, the GMI's directory,
its timing tree and timeline, the metrics writer (GMI 0), the episodes so far; and `iterate`,
the loop they share: one `run_iteration` per iteration, a metrics row every ``log.log_every``
iterations and at the last (the weights digested and checked for NaN first), a checkpoint (GMI 0) every
``checkpoint.every`` iterations and at the last. A learner may return its metrics and episodes
on its device (0-d tensors, `gmi_drl.rollout.episodes.DeviceEpisodes`): the loop reads the
metrics of the logged iterations only, and the episodes at a row, a checkpoint, or after
`PENDING_ITERATIONS` iterations, so the iterations between never wait for the device (and its
phase times there are the host's: the GPU's work shows where the host next waits).
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Callable, NamedTuple

import numpy as np
import torch

from gmi_drl.errors import check_finite
from gmi_drl.rollout.episodes import DeviceEpisodes, Episodes
from gmi_drl.runner.run import Run
from gmi_drl.telemetry.memory import peak_memory_bytes
from gmi_drl.telemetry.metrics import MetricsWriter
from gmi_drl.telemetry.progress import Progress
from gmi_drl.telemetry.timeline import Timeline
from gmi_drl.telemetry.timer import SectionStats, TimingTree, set_tree


PENDING_ITERATIONS = 256
"""iterations whose episodes may wait on the device for the next metrics row (`GMIShell.record`):
a bound on the device memory they hold (each its collection's ``(num_steps, num_envs)`` ends and
totals)"""


class LoopResult(NamedTuple):
    """What one learning GMI's loop returns."""

    global_step: int
    wall_s: float
    """seconds in the loop (setup excluded)"""
    steps_this_process: int
    """env steps of every GMI taken in this loop (less than global_step after a resume)"""
    episode_steps: np.ndarray
    """``(k,) int64`` global_step at the end of the iteration in which each episode finished"""
    episode_returns: np.ndarray
    """``(k,) float64``"""
    episode_wall_s: np.ndarray
    """``(k,) float64`` loop seconds at that point (0 for episodes before a resume)"""
    weights_digest: str
    """sha256 chained over the weights after every logged update of this loop (every
    ``log.log_every`` iterations and the last; equal on all GMIs iff their weights were
    identical then)"""
    phases: dict[str, SectionStats]
    """this GMI's timing tree"""
    peak_memory_bytes: int = 0
    """this GMI's peak memory on its device (`gmi_drl.telemetry.memory`), bytes"""
    steady_sps: float = float("nan")
    """env steps/s of every GMI after this loop's first iteration, which pays the one-time
    costs (torch.compile, first allocations); nan for a loop of one iteration"""
    fragments_trained: int = 0
    """async trainer GMIs: experience fragments trained on in this loop"""
    fragments_dropped: int = 0
    """async trainer GMIs: fragments left out in this loop as older than
    ``async.max_policy_lag`` versions"""


class GMIShell:
    """The parts of a learning GMI that do not depend on its template (module docstring).

    A subclass builds its learner after ``super().__init__`` (``resume_state`` holds the
    checkpoint it continues from, or ``None``), opening its timing tree (`start_timing`) before
    and its metrics writer (`open_writer`) after; it gives `global_batch`, `run_iteration`,
    `trained_modules` and `state_dict`, and may give `row`, `phase`, `iteration`, `started`
    and `finished`.

    Args:
        run: the run. rank: this GMI's id.
    """

    def __init__(self, run: Run, rank: int) -> None:
        self.cfg = run.config
        self.run, self.rank = run, rank
        self.gmi_dir = run.gmi_dir(rank)
        self.gmi_dir.mkdir(parents=True, exist_ok=True)
        self.resume_state = run.load_resume()
        state = self.resume_state
        self.first_iteration = int(state["iteration"]) if state else 0
        self.episode_steps: list[int] = state["episode_steps"].tolist() if state else []
        self.episode_returns: list[float] = state["episode_returns"].tolist() if state else []
        self.episode_wall_s = [0.0] * len(self.episode_steps)
        self.unlogged: list[Episodes] = []
        """the episodes since the last metrics row (the row summarises them all)"""
        self._pending: list[tuple[Episodes | DeviceEpisodes, int, float]] = []
        """iterations' episodes not yet read to the host, with their step and wall time
        (`record`)"""
        self.tree = TimingTree()
        self.writer: MetricsWriter | None = None

    def start_timing(self, process_name: str, cpu_times: bool = False) -> None:
        """This thread's timing tree from now on, with the timeline's ``process_name`` for this
        GMI (``cpu_times``: also count each section's process CPU time, ``perf/PATH_cpu_s``)."""
        self.tree = TimingTree(Timeline(self.cfg.log.timeline_detail_events,
                                        process_name=process_name), cpu=cpu_times)
        set_tree(self.tree)

    def open_writer(self) -> None:
        """GMI 0's metrics writer (rows after the resumed step are dropped from its files)."""
        if self.rank == 0:
            start = int(self.resume_state["global_step"]) if self.resume_state else 0
            self.writer = MetricsWriter(self.run.run_dir, self.cfg.log.tensorboard,
                                        purge_step=start or None)

    @property
    def global_batch(self) -> int:
        """Env steps (async: samples trained on) one iteration adds to global_step."""
        raise NotImplementedError

    def run_iteration(self, k: int) -> tuple[Episodes | DeviceEpisodes, dict]:
        """Iteration ``k``'s work: the episodes that ended in it and the learner's metrics."""
        raise NotImplementedError

    def drain(self) -> dict[str, float]:
        """Before an iteration's weights are digested or saved: every gradient step the
        learner left in flight is in them, identical on every GMI (every GMI calls it at the
        same iteration); returns the steps' metrics. Nothing to do by default."""
        return {}

    def trained_modules(self) -> dict:
        """``{name: state_dict}`` of the weights the learner trains (digested, checked)."""
        raise NotImplementedError

    def state_dict(self, global_step: int, iteration: int) -> dict:
        """What a checkpoint holds (`shell_state` and the learner's; the config is added by
        `Run.save_checkpoint`)."""
        raise NotImplementedError

    def shell_state(self, global_step: int, iteration: int) -> dict:
        """The shell's part of a checkpoint: the counts, torch's RNG, the episodes."""
        self.settle()
        return {"global_step": global_step, "iteration": iteration, "rng": torch.get_rng_state(),
                "episode_steps": torch.tensor(self.episode_steps, dtype=torch.int64),
                "episode_returns": torch.tensor(self.episode_returns, dtype=torch.float64)}

    def row(self, elapsed_s: float) -> dict[str, float]:
        """Metrics a subclass adds to each row."""
        return {}

    def phase(self, name: str):
        """The context of the loop's own phases (``log``, ``checkpoint``)."""
        return contextlib.nullcontext()

    def iteration(self, k: int):
        """The context around iteration ``k`` besides the timing tree's."""
        return contextlib.nullcontext()

    def started(self) -> None:
        """Called as the loop's clock starts."""

    def finished(self) -> dict:
        """Called after a loop that ended well (the shell closed); its `LoopResult` fields."""
        return {}

    def record(self, episodes: Episodes | DeviceEpisodes, global_step: int,
               wall_s: float) -> None:
        """The episodes that ended in an iteration, at ``global_step`` and ``wall_s`` seconds.
        Episodes still on the device (`DeviceEpisodes`) are read to the host at the next
        metrics row or checkpoint (`settle`), or after `PENDING_ITERATIONS` iterations, not in
        every iteration."""
        self._pending.append((episodes, global_step, wall_s))
        if isinstance(episodes, Episodes) or len(self._pending) >= PENDING_ITERATIONS:
            self.settle()

    def settle(self) -> None:
        """Every recorded iteration's episodes on the host, in order."""
        for episodes, global_step, wall_s in self._pending:
            if isinstance(episodes, DeviceEpisodes):
                episodes = episodes.host()
            n = len(episodes.returns)
            self.episode_steps += [global_step] * n
            self.episode_returns += episodes.returns.tolist()
            self.episode_wall_s += [wall_s] * n
            if n:
                self.unlogged.append(episodes)
        self._pending.clear()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.tree.timeline.write(self.gmi_dir / "timeline.json")
        set_tree(TimingTree())

    def iterate(self, progress: Callable[[Progress], None] | None) -> LoopResult:
        """Iterations ``first_iteration .. num_iterations - 1`` (module docstring); closes
        the GMI. ``progress`` (GMI 0) gets a `Progress` with every metrics row."""
        cfg = self.cfg
        n_iter, batch, first = cfg.num_iterations, self.global_batch, self.first_iteration
        chain = hashlib.sha256()
        self.started()
        t0 = time.perf_counter()
        # phase totals at the last metrics row: a row gives the mean per iteration since then,
        # so the log and checkpoint phases, which end after a row is written, count in the next
        before, logged_k = _totals(self.tree), first
        first_s = None  # seconds to the end of this loop's first iteration
        try:
            for k in range(first, n_iter):
                with self.iteration(k), self.tree.iteration(k):
                    episodes, metrics = self.run_iteration(k)
                    global_step, last = (k + 1) * batch, k + 1 == n_iter
                    every = cfg.checkpoint.every
                    logged = (k + 1) % cfg.log.log_every == 0 or last
                    if logged or (every and (k + 1) % every == 0):
                        with self.phase("update"):  # every GMI at the same k: a collective
                            metrics = {**metrics, **self.drain()}
                    with self.phase("log"):
                        elapsed = time.perf_counter() - t0
                        first_s = elapsed if k == first else first_s
                        self.record(episodes, global_step, elapsed)
                        if logged:  # (the metrics of other iterations are never read)
                            self.settle()
                            metrics = {k: float(v) for k, v in metrics.items()}
                            modules = self.trained_modules()
                            _digest(chain, modules)
                            check_finite(modules, global_step, metrics)
                            now = _totals(self.tree)
                            metrics = {**metrics, **per_iteration(now, before, k + 1 - logged_k)}
                            before, logged_k = now, k + 1
                            self._log(global_step, metrics, (k + 1 - first) * batch / elapsed,
                                      elapsed, progress)
                    if self.rank == 0 and ((every and (k + 1) % every == 0) or last):
                        with self.phase("checkpoint"):
                            self.run.save_checkpoint(self.state_dict(global_step, k + 1))
                            if self.writer is not None:  # a GMI may be killed: rows survive
                                self.writer.flush()
        finally:
            wall = time.perf_counter() - t0
            self.close()
        return LoopResult(n_iter * batch, wall, (n_iter - first) * batch,
                          np.array(self.episode_steps, np.int64), np.array(self.episode_returns),
                          np.array(self.episode_wall_s), chain.hexdigest(), self.tree.stats(),
                          peak_memory_bytes(cfg.device),
                          steady_sps(n_iter - first, batch, wall, first_s), **self.finished())

    def _log(self, global_step: int, metrics: dict, sps: float, elapsed_s: float,
             progress: Callable[[Progress], None] | None) -> None:
        """A metrics row of the episodes since the last one (GMI 0 writes it), and the
        progress."""
        episodes = Episodes.merge(self.unlogged)
        self.unlogged.clear()
        if self.writer is None and progress is None:
            return
        metrics = dict(metrics)
        if len(episodes.returns):
            metrics["env/episodic_return"] = float(episodes.returns.mean())
            metrics["env/episodic_length"] = float(episodes.lengths.mean())
            for name, totals in episodes.extras.items():
                metrics[f"env/episodic_{name}"] = float(totals.mean())
        metrics["perf/sps"] = sps
        metrics.update(self.row(elapsed_s))
        if self.writer is not None:
            self.writer.log(global_step, metrics)
        if progress is not None:
            recent = np.mean(self.episode_returns[-20:]) if self.episode_returns else np.nan
            progress(Progress(global_step, self.cfg.num_iterations * self.global_batch, sps,
                              float(recent), elapsed_s))


def steady_sps(iterations: int, batch: int, wall_s: float, first_s: float | None) -> float:
    """Env steps/s after a loop's first iteration (``first_s`` seconds in) over its
    ``iterations`` of ``batch`` env steps; nan with fewer than two."""
    if iterations < 2 or first_s is None or wall_s <= first_s:
        return float("nan")
    return (iterations - 1) * batch / (wall_s - first_s)


def per_iteration(now: dict[str, float], before: dict[str, float],
                  iterations: int) -> dict[str, float]:
    """``perf/PATH_s``: seconds per iteration of each timer path over the ``iterations`` between
    two snapshots of its totals (``before`` may lack paths opened since)."""
    return {f"perf/{path}_s": (total - before.get(path, 0.0)) / iterations
            for path, total in now.items()}


def _totals(tree) -> dict[str, float]:
    """Seconds of every section of ``tree`` so far, wall (``PATH``) and CPU (``PATH_cpu``),
    under the keys the metrics give them (``perf/PATH_s``, ``perf/PATH_cpu_s``)."""
    return {**tree.snapshot_s(),
            **{f"{path}_cpu": total for path, total in tree.snapshot_cpu_s().items()}}


def _digest(chain, modules: dict) -> None:
    """Fold every weight tensor of ``modules`` (``{name: state_dict}``) into ``chain``."""
    for name in sorted(modules):
        for tensor in modules[name].values():
            chain.update(tensor.detach().cpu().numpy().tobytes())
