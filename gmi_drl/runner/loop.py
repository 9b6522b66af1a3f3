"""The holistic GMI of the ``sync_training`` template: collect -> update each iteration, in
the `GMIShell`'s loop (log, checkpoint), over the algorithm protocol.

`gmi_main` is the one GMI target of every placement (serial threads, local processes, Ray
actors). It builds the GMI (`HolisticGMI`: pool, algorithm, normalisers, profiler), iterates
it, and returns a `LoopResult`. The algorithm is reached only through
`gmi_drl.algos.base.Algorithm`; nothing here names one.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable

import torch
from threadpoolctl import threadpool_limits

from gmi_drl.algos import AlgoContext, build_algorithm
from gmi_drl.optim.grad_step import make_grad_step
from gmi_drl.rollout.arrays import arrays_for
from gmi_drl.rollout.episodes import DeviceEpisodes, Episodes
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer
from gmi_drl.runner.run import Run
from gmi_drl.runner.shell import GMIShell, LoopResult
from gmi_drl.telemetry.profiler import make_profiler
from gmi_drl.telemetry.progress import Progress


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


def gmi_main(ctx) -> LoopResult:
    """One GMI of a run (the target every placement starts): a `HolisticGMI`, iterated."""
    spec: LoopSpec = ctx.payload
    g = spec.run.config.gmi
    threshold = (g.threshold, g.staleness) if g.threshold is not None else None
    gmi = HolisticGMI(spec.run, ctx.gmi_id, ctx.make_reducer(threshold))
    return gmi.iterate(spec.progress if ctx.gmi_id == 0 else None)


_BUILD_LOCK = threading.Lock()
"""torch's global RNG is per process: GMIs that are threads of one process seed it and build
their networks one at a time, so every GMI starts from the run seed's weights"""


class HolisticGMI(GMIShell):
    """A holistic GMI (simulator, agent and trainer in one; GMI-DRL §5.1): pool, algorithm,
    normalisers, action RNG and profiler in the `GMIShell`; built from the run's config and
    checkpoint.

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

        cfg = run.config
        torch.set_num_threads(cfg.torch_threads)
        threadpool_limits(cfg.torch_threads, user_api="blas")  # NumPy's matmuls (acting)
        super().__init__(run, rank)
        state = self.resume_state
        start_step = int(state["global_step"]) if state else 0
        e, device = cfg.env, torch.device(cfg.device)
        self.pool = envs.make(e.task_id, e.num_envs,
                              num_workers=0 if cfg.placement == "serial" else e.num_workers,
                              seed=cfg.seed + start_step + rank * e.num_envs,
                              autoreset="same_step", device=cfg.device,
                              **e.pool_kwargs())
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
                                  cuda_graphs=cfg.cuda_graphs, precision=cfg.precision,
                                  staleness_bound=g.staleness
                                  if g.staleness or g.threshold is not None else None)
        self.start_timing(f"gmi-{rank}", cpu_times=cfg.log.cpu_times)
        self.profiler = make_profiler(cfg.profile, rank, run.profile_dir(rank), self.tree)
        with _BUILD_LOCK:
            torch.manual_seed(cfg.seed)
            self.algo = build_algorithm(cfg.algo, AlgoContext(
                self.pool.spec, e.num_envs, cfg.model, cfg.num_iterations, cfg.seed, steps,
                self.action_rng, device, self.obs_norm, self.reward_norm, cfg.compile,
                self.profiler.phase))
        if state is not None:
            try:
                self._restore(state)
            except (ValueError, KeyError, RuntimeError, TypeError) as err:
                self.pool.close()  # (its env threads or workers would outlive the error)
                raise CheckpointError(
                    f"checkpoint does not match this run: {str(err).splitlines()[0]}; resume "
                    "from an earlier checkpoint of the run (--resume RUN_DIR/checkpoints/"
                    "iteration-N.pt) or start a new run") from None
        self.open_writer()

    @property
    def global_batch(self) -> int:
        """Env steps one iteration adds to global_step (every GMI's)."""
        return self.algo.steps_per_iteration * self.cfg.gmi.num_gmis

    def run_iteration(self, k: int) -> tuple[Episodes | DeviceEpisodes, dict]:
        """Collect (the algorithm opens its phases), then update."""
        episodes = self.algo.collect(self.pool)
        with self.profiler.phase("update"):
            return episodes, self.algo.update()

    def drain(self) -> dict[str, float]:
        # an algorithm that leaves stale-sync steps in flight across updates drains them here
        drain = getattr(self.algo, "drain", None)
        return drain() if drain is not None else {}

    def trained_modules(self) -> dict:
        return self.algo.state_dict()["modules"]

    def phase(self, name: str):
        return self.profiler.phase(name)

    def iteration(self, k: int):
        return self.profiler.iteration(k)

    def state_dict(self, global_step: int, iteration: int) -> dict:
        return {**self.shell_state(global_step, iteration), "algo": self.algo.state_dict(),
                "obs_norm": self.obs_norm.state_dict() if self.obs_norm else None,
                "reward_norm": self.reward_norm.state_dict() if self.reward_norm else None,
                "action_rng": self.action_rng.get_state()}

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

    def close(self) -> None:
        self.algo.close()
        self.pool.close()
        self.profiler.close()
        super().close()
