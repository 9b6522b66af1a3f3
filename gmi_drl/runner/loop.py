"""The training loop of one GMI: collect -> update -> log (-> checkpoint), over the protocol.

`gmi_main` is the one GMI target of every placement (serial threads, local processes, Ray
actors). It builds the GMI's `Trainer` (pool, algorithm, normalisers, sinks, timer, profiler),
runs `loop`, and returns a `LoopResult`. The algorithm is reached only through
`gmi_drl.algos.base.Algorithm`; nothing here names one.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gmi_drl.algos import AlgoContext, build_algorithm
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.arrays import arrays_for
from gmi_drl.rollout.collector import Episodes
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.runner.run import Run
from gmi_drl.telemetry.memory import peak_memory_bytes
from gmi_drl.errors import check_finite
from gmi_drl.telemetry.metrics import MetricsWriter
from gmi_drl.telemetry.profiler import make_profiler
from gmi_drl.telemetry.progress import Progress
from gmi_drl.telemetry.timeline import Timeline
from gmi_drl.telemetry.timer import SectionStats, TimingTree, set_tree


@dataclass(frozen=True)
class LoopSpec:
    """The payload every GMI of a run receives.

    Attributes:
        run: the run (directory, config, checkpoint to resume from).
        progress: called with a `Progress` by GMI 0 every ``log.log_every`` iterations, or
            ``None``; placements that start processes pass a `ProgressPrinter` instead of a
            callback that cannot travel.
    """

    run: Run
    progress: Callable[[Progress], None] | None = None


class LoopResult(NamedTuple):
    """What one GMI's loop returns."""

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


def gmi_main(ctx) -> LoopResult:
    """One GMI of a run (the target every placement starts): `Trainer` then `loop`."""
    spec: LoopSpec = ctx.payload
    trainer = Trainer(spec.run, ctx.gmi_id, ctx.make_reducer())
    return loop(trainer, spec.progress if ctx.gmi_id == 0 else None)


_BUILD_LOCK = threading.Lock()
"""torch's global RNG is per process: GMIs that are threads of one process seed it and build
their networks one at a time, so every GMI starts from the run seed's weights"""


class Trainer:
    """Everything one GMI holds: pool, algorithm, normalisers, action RNG, sinks, timer,
    profiler, and the episodes finished so far; built from the run's config and checkpoint.

    Every GMI seeds torch alike (identical initial weights); GMI ``k``'s envs get seeds
    ``seed + global_step + k * num_envs + i`` and its action generator a seed of its own. GMIs
    other than 0 keep only their timeline, in ``<run_dir>/gmi-<k>/``; profiler outputs go to
    ``<run_dir>/profile/gmi-<k>/``.

    Raises:
        CheckpointError: the checkpoint to resume from is corrupt or does not fit.
    """

    def __init__(self, run: Run, rank: int, reducer) -> None:
        from gmi_drl import envs
        from gmi_drl.checkpoint import CheckpointError

        cfg = self.cfg = run.config
        self.run, self.rank = run, rank
        torch.set_num_threads(cfg.torch_threads)
        threadpool_limits(cfg.torch_threads, user_api="blas")  # NumPy's matmuls (acting)
        state = run.load_resume()
        start_step = int(state["global_step"]) if state else 0
        self.gmi_dir = run.gmi_dir(rank)
        self.gmi_dir.mkdir(parents=True, exist_ok=True)
        e, device = cfg.env, torch.device(cfg.device)
        self.pool = envs.make(e.task_id, e.num_envs,
                              num_workers=0 if cfg.placement == "serial" else e.num_workers,
                              seed=cfg.seed + start_step + rank * e.num_envs,
                              autoreset="same_step", device=cfg.device,
                              engine=e.engine)
        arrays, n = arrays_for(device), cfg.norm
        space = self.pool.observation_space
        self.obs_norm = (ObsNormalizer(space.shape, n.obs_clip, arrays=arrays) if n.obs
                         else None)
        self.reward_norm = (RewardNormalizer(e.num_envs, cfg.algo.gamma, n.reward_clip,
                                             arrays=arrays) if n.reward else None)
        # GMIs never draw the same action noise; a resumed GMI other than 0 continues with a
        # generator of its own (the checkpoint holds GMI 0's)
        self.action_rng = torch.Generator(device).manual_seed(cfg.seed + 1 + 7919 * rank
                                                             + start_step)
        g = cfg.gmi
        steps = functools.partial(make_grad_step, reducer=reducer, compile=cfg.compile,
                                  cuda_graphs=cfg.cuda_graphs,
                                  staleness_bound=g.staleness if g.reduction == "switch"
                                  and g.staleness else None)
        self.tree = TimingTree(Timeline(cfg.log.timeline_detail_events,
                                        process_name=f"gmi-{rank}"), cpu=cfg.log.cpu_times)
        set_tree(self.tree)
        self.profiler = make_profiler(cfg.profile, rank, run.profile_dir(rank), self.tree)
        with _BUILD_LOCK:
            torch.manual_seed(cfg.seed)
            self.algo = build_algorithm(cfg.algo, AlgoContext(
                self.pool.spec, e.num_envs, cfg.model, cfg.num_iterations, cfg.seed, steps,
                self.action_rng, device, self.obs_norm, self.reward_norm, cfg.compile,
                self.profiler.phase))
        self.first_iteration = 0
        self.episode_steps: list[int] = []
        self.episode_returns: list[float] = []
        if state is not None:
            try:
                self._restore(state)
            except (ValueError, KeyError, RuntimeError, TypeError) as err:
                self.pool.close()  # (its env threads or workers would outlive the error)
                raise CheckpointError(
                    f"checkpoint does not match this run: {str(err).splitlines()[0]}; resume "
                    "from an earlier checkpoint of the run (--resume RUN_DIR/checkpoints/"
                    "iteration-N.pt) or start a new run") from None
        self.episode_wall_s = [0.0] * len(self.episode_steps)
        self.unlogged: list[Episodes] = []
        """the episodes since the last logged iteration (its row summarises them all)"""
        self.writer = (MetricsWriter(run.run_dir, cfg.log.tensorboard,
                                     purge_step=start_step or None) if rank == 0 else None)

    @property
    def global_batch(self) -> int:
        """Env steps one iteration adds to global_step (every GMI's)."""
        return self.algo.steps_per_iteration * self.cfg.gmi.num_gmis

    def record(self, episodes: Episodes, global_step: int, wall_s: float) -> None:
        n = len(episodes.returns)
        self.episode_steps += [global_step] * n
        self.episode_returns += episodes.returns.tolist()
        self.episode_wall_s += [wall_s] * n
        if n:
            self.unlogged.append(episodes)

    def state_dict(self, global_step: int, iteration: int) -> dict:
        """What a checkpoint holds (the config is added by `Run.save_checkpoint`)."""
        return {
            "global_step": global_step, "iteration": iteration, "algo": self.algo.state_dict(),
            "obs_norm": self.obs_norm.state_dict() if self.obs_norm else None,
            "reward_norm": self.reward_norm.state_dict() if self.reward_norm else None,
            "action_rng": self.action_rng.get_state(), "rng": torch.get_rng_state(),
            "episode_steps": torch.tensor(self.episode_steps, dtype=torch.int64),
            "episode_returns": torch.tensor(self.episode_returns, dtype=torch.float64)}

    def _restore(self, state: dict) -> None:
        """Load the algorithm, normalisers and RNGs from a checkpoint (the action generator on
        GMI 0 only: it is GMI 0's; a saved replay buffer with one GMI only: it is GMI 0's).
        Raises ``ValueError``, ``KeyError``, ``RuntimeError`` or ``TypeError`` (torch's, for
        tensors of other shapes or types) when it does not fit."""
        algo = state["algo"]
        if self.cfg.gmi.num_gmis > 1 and "replay" in algo:
            # GMI 0's replay: every GMI refills its own instead, all in step (a collective
            # gradient step needs every GMI)
            algo = {k: v for k, v in algo.items() if k != "replay"}
        self.algo.load_state_dict(algo)
        for name in ("obs_norm", "reward_norm"):
            norm = getattr(self, name)
            if (norm is None) != (state[name] is None):
                raise ValueError(f"{name} is {'on' if norm else 'off'} in this config but "
                                 f"{'off' if norm else 'on'} in the checkpoint")
            if norm is not None:
                norm.load_state_dict(state[name])
        if self.rank == 0:
            self.action_rng.set_state(state["action_rng"])
        torch.set_rng_state(state["rng"])
        self.first_iteration = int(state["iteration"])
        self.episode_steps = state["episode_steps"].tolist()
        self.episode_returns = state["episode_returns"].tolist()

    def close(self) -> None:
        self.algo.close()
        self.pool.close()
        if self.writer is not None:
            self.writer.close()
        self.profiler.close()
        self.tree.timeline.write(self.gmi_dir / "timeline.json")
        set_tree(TimingTree())


def loop(t: Trainer, progress: Callable[[Progress], None] | None) -> LoopResult:
    """Iterations ``first .. num_iterations - 1`` of one GMI: collect -> update -> log, and a
    checkpoint every ``checkpoint.every`` iterations and at the end (GMI 0). Each top-level
    phase is ``prof.phase(name)`` (the algorithm opens its collection's phases itself);
    ``prof.iteration`` and ``tree.iteration`` bracket each iteration. Closes the trainer."""
    cfg, algo, prof = t.cfg, t.algo, t.profiler
    n_iter, batch, first = cfg.num_iterations, t.global_batch, t.first_iteration
    chain = hashlib.sha256()
    t0 = time.perf_counter()
    # phase totals at the last metrics row: a row gives the mean per iteration since then, so
    # the log and checkpoint phases, which end after a row is written, count in the next one
    before, logged_k = _totals(t.tree), first
    first_s = None  # seconds to the end of this loop's first iteration
    try:
        for k in range(first, n_iter):
            with prof.iteration(k), t.tree.iteration(k):
                episodes = algo.collect(t.pool)
                with prof.phase("update"):
                    metrics = algo.update()
                global_step, last = (k + 1) * batch, k + 1 == n_iter
                with prof.phase("log"):
                    elapsed = time.perf_counter() - t0
                    first_s = elapsed if k == first else first_s
                    t.record(episodes, global_step, elapsed)
                    if (k + 1) % cfg.log.log_every == 0 or last:
                        modules = algo.state_dict()["modules"]
                        _digest(chain, modules)
                        check_finite(modules, global_step, metrics)
                        sps = (k + 1 - first) * batch / elapsed
                        now = _totals(t.tree)
                        metrics.update(per_iteration(now, before, k + 1 - logged_k))
                        before, logged_k = now, k + 1
                        _log(t, global_step, Episodes.merge(t.unlogged), metrics, sps,
                             elapsed, progress)
                        t.unlogged.clear()
                every = cfg.checkpoint.every
                if t.rank == 0 and ((every and (k + 1) % every == 0) or last):
                    with prof.phase("checkpoint"):
                        t.run.save_checkpoint(t.state_dict(global_step, k + 1))
                        if t.writer is not None:  # a GMI process may be killed: rows survive
                            t.writer.flush()
    finally:
        wall = time.perf_counter() - t0
        t.close()
    return LoopResult(n_iter * batch, wall, (n_iter - first) * batch,
                      np.array(t.episode_steps, np.int64), np.array(t.episode_returns),
                      np.array(t.episode_wall_s), chain.hexdigest(), t.tree.stats(),
                      peak_memory_bytes(cfg.device),
                      steady_sps(n_iter - first, batch, wall, first_s))


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


def _log(t: Trainer, global_step: int, episodes: Episodes, losses: dict, sps: float,
         elapsed_s: float, progress: Callable[[Progress], None] | None) -> None:
    metrics = dict(losses)
    if len(episodes.returns):
        metrics["env/episodic_return"] = float(episodes.returns.mean())
        metrics["env/episodic_length"] = float(episodes.lengths.mean())
        for name, totals in episodes.extras.items():
            metrics[f"env/episodic_{name}"] = float(totals.mean())
    metrics["perf/sps"] = sps
    if t.writer is not None:
        t.writer.log(global_step, metrics)
    if progress is not None:
        recent = np.mean(t.episode_returns[-20:]) if t.episode_returns else np.nan
        progress(Progress(global_step, t.cfg.num_iterations * t.global_batch, sps,
                          float(recent), elapsed_s))
