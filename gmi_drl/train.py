"""Training: wire a `TrainConfig` into pool, model, learner and sinks, then run the loop.

The loop is the four verbs of DESIGN.md §2, collect -> advantages -> update -> log, in one
process (the serial placement; multi-GMI placements reuse the same verbs).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from gmi_drl.algos.ppo import PPO
from gmi_drl.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from gmi_drl.config import TrainConfig, to_dict, validate
from gmi_drl.envs import EnvPool
from gmi_drl.models.actor_critic import ActorCritic, build_actor_critic
from gmi_drl.rollout import Collector, ObsNormalizer, RewardNormalizer, RolloutBuffer
from gmi_drl.telemetry.gpu_util import start_gpu_sampler
from gmi_drl.telemetry.metrics import MetricsWriter
from gmi_drl.telemetry.profiler import (NSYS_OPTIONS, Profiler, list_reports, make_profiler,
                                        nsight_runtime_env, nsys_command)
from gmi_drl.telemetry.progress import Progress
from gmi_drl.telemetry.summary import RunSummary, write_summary
from gmi_drl.telemetry.timeline import Timeline
from gmi_drl.telemetry.timer import TimingTree, set_tree

log = logging.getLogger(__name__)


class TrainResult(NamedTuple):
    """What `train` returns."""

    run_dir: Path
    global_step: int
    wall_s: float
    """seconds in the loop (setup excluded)"""
    episode_steps: np.ndarray
    """``(k,) int64`` global_step at the end of the update in which each episode finished"""
    episode_returns: np.ndarray
    """``(k,) float64``"""
    episode_wall_s: np.ndarray
    """``(k,) float64`` loop seconds at that point (0 = start of this process's loop)"""
    param_digests: tuple[str, ...] = ()
    """per GMI, a sha256 chained over the flat parameters after every update of this process
    (equal on all GMIs iff their weights were identical after each update)"""


def make_pool(cfg: TrainConfig, seed: int):
    """The run's `EnvPool` (``same_step`` autoreset). With ``cfg.serial`` a generic (Gymnasium)
    task steps in this process instead of in worker processes."""
    from gmi_drl import envs

    e = cfg.env
    return envs.make(e.task_id, e.num_envs, num_workers=0 if cfg.serial else e.num_workers,
                     seed=seed, autoreset="same_step")


@dataclass
class _Run:
    """Everything one training process holds (built by `_setup`)."""

    run_dir: Path
    pool: EnvPool
    model: ActorCritic
    learner: PPO
    collector: Collector
    buf: RolloutBuffer
    writer: MetricsWriter
    tree: TimingTree
    profiler: Profiler
    episode_steps: list[int]
    """global_step of each finished episode (whole run, resumes included)"""
    episode_returns: list[float]
    episode_wall_s: list[float]
    """loop seconds of this process at each episode (0 for episodes before a resume)"""
    rank: int = 0
    """this process's GMI id; only rank 0 writes metrics, checkpoints and the summary"""
    sync_weights: Callable[[], None] | None = None
    """copies a GPU learner's weights into the acting CPU model (None: one model on the CPU)"""

    def record(self, episodes, global_step: int, wall_s: float) -> None:
        n = len(episodes.returns)
        self.episode_steps += [global_step] * n
        self.episode_returns += episodes.returns.tolist()
        self.episode_wall_s += [wall_s] * n

    def close(self) -> None:
        self.learner.close()
        self.pool.close()
        if self.writer is not None:
            self.writer.close()
        self.profiler.close()
        self.tree.timeline.write(self.run_dir / "timeline.json")
        set_tree(TimingTree())


def train(cfg: TrainConfig, on_progress: Callable[[Progress], None] | None = None) -> TrainResult:
    """Train ``cfg.algo`` on ``cfg.env.task_id`` for ``cfg.num_iterations`` updates; blocks.

    Writes the run directory (config.json, metrics.csv, TensorBoard events, checkpoints/,
    timeline.json, summary.md, learning_curve.png; gpu_util.csv where NVML sees a GPU; with
    ``profile.tool`` set, profile/ with the tool's reports and the merged report of
    `gmi_drl.telemetry.report`). ``on_progress`` gets a `Progress` every ``log.log_every``
    updates (the CLI prints it).

    Raises:
        ConfigError: invalid config (every field named). CheckpointError: bad ``--resume`` file.
    """
    validate(cfg)
    if cfg.run_dir is None and cfg.resume is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        cfg.run_dir = str(Path("runs") / f"{cfg.env.task_id.replace('/', '_')}-{cfg.algo}-{stamp}")
    run_dir = (resolve_checkpoint(cfg.resume).parent.parent if cfg.resume is not None
               else Path(cfg.run_dir))
    with _controller(cfg, run_dir):
        prefixes = {} if cfg.serial else _nsys_prefixes(cfg, run_dir)
        if cfg.gmi.num_gmis > 1 or prefixes or cfg.launcher == "ray":
            return _train_gmis(cfg, on_progress is not None, prefixes)
        return _train_process(cfg, 0, None, on_progress)


@contextlib.contextmanager
def _controller(cfg: TrainConfig, run_dir: Path):
    """The controller's telemetry around a run: samples GPU utilisation, and, when profiling,
    says where it runs (papers/004: a controller's reports are found by host and pid) and, at
    the end, writes the merged report and lists where every report landed."""
    profiling, host = cfg.profile.tool != "none", socket.gethostname()
    if profiling:
        log.info("profiling with %s: controller on host %s, pid %d; reports under %s",
                 cfg.profile.tool, host, os.getpid(), run_dir.resolve())
        if cfg.profile.tool == "nsys" and cfg.serial:
            log.info("serial run: to capture it, start it under Nsight Systems yourself: nsys "
                     "profile %s gmi-drl train ...",
                     " ".join(f"--{k}={v}" for k, v in NSYS_OPTIONS.items()))
    interval = cfg.log.gpu_util_interval_s
    sampler = start_gpu_sampler(run_dir / "gpu_util.csv", interval) if interval > 0 else None
    try:
        yield
    finally:
        if sampler is not None:
            sampler.stop()
    if profiling:
        from gmi_drl.telemetry.report import write_report

        try:
            write_report(run_dir)
        except (OSError, ValueError) as e:  # the run itself succeeded: say so, do not fail it
            log.warning("profiling: the merged report was not written: %s", e)
        log.info("profiling reports (host %s):\n  %s\nrebuild the merged report with: gmi-drl "
                 "profile report %s", host, "\n  ".join(str(p) for p in list_reports(run_dir)),
                 run_dir)


def _nsys_prefixes(cfg: TrainConfig, run_dir: Path) -> dict[int, list[str]]:
    """``{gmi_id: nsys command}`` for the GMIs that run under Nsight Systems: with
    ``profile.tool nsys``, the selected GMIs, where ``nsys`` is on PATH and NVML sees a GPU
    (its capture ranges need CUDA); otherwise none, with a warning saying why."""
    if cfg.profile.tool != "nsys":
        return {}
    from gmi_drl.gmi.devices import discover

    machine = discover()
    if not machine.gpus:
        log.warning("profiling: %s: nsys capture ranges need CUDA; GMIs run without Nsight "
                    "Systems, only the built-in timeline.json is written", machine.no_gpu_reason)
        return {}
    prefixes = {k: c for k in range(cfg.gmi.num_gmis)
                if (c := nsys_command(cfg.profile, k, run_dir)) is not None}
    for k in prefixes:  # nsys does not create its output directory
        (run_dir / "profile" / f"gmi-{k}").mkdir(parents=True, exist_ok=True)
    return prefixes


def _nsight_runtime_envs(cfg: TrainConfig, layout) -> list[dict | None] | None:
    """Per GMI, the Ray ``runtime_env`` part that runs its actor under Nsight Systems (papers/004:
    ``{"nsight": ...}`` per actor instance), or ``None`` when no GMI is profiled with nsys."""
    if cfg.profile.tool != "nsys":
        return None
    envs = [nsight_runtime_env(cfg.profile, k, cfg.run_dir) for k in range(layout.num_gmis)]
    return envs if any(e is not None for e in envs) else None


def _train_gmis(cfg: TrainConfig, show_progress: bool,
                prefixes: dict[int, list[str]]) -> TrainResult:
    """Training over ``cfg.gmi.num_gmis`` holistic GMIs (GMI-DRL §5.1 TCG_EX): one process
    each, launched by `gmi_drl.gmi.launcher` (GMI ``k`` under ``prefixes[k]`` where given) or
    one Ray actor each by `gmi_drl.cluster.ray_launcher` (GMI ``k`` with its Nsight
    ``runtime_env`` where profiled); GMI 0 writes the run directory."""
    from gmi_drl.gmi.devices import discover
    from gmi_drl.gmi.layout import plan

    machine = discover()
    g = cfg.gmi
    backend = None if g.backend == "auto" else g.backend
    if backend is None and g.num_gmis == 1 and machine.gpus:
        backend = "cuda_shared"  # one GMI (launched to run under nsys) shares no GPU: no MPS
    layout = plan(g.num_gmis, machine, num_devices=g.num_devices, backend=backend)
    log.info("GMI layout %s, backend %s, reduction %s", layout.mpl, layout.backend.value,
             layout.strategy.value)
    switch = g.switch_addr if g.reducer == "switch" else None
    payload = (cfg, show_progress)
    if cfg.launcher == "ray":
        from gmi_drl.cluster.membership import describe
        from gmi_drl.cluster.ray_launcher import launch as launch_ray

        r = cfg.ray
        run = launch_ray("gmi_drl.train:gmi_main", layout, payload, address=r.address,
                         max_restarts=r.max_restarts, num_cpus_per_gmi=r.num_cpus_per_gmi,
                         placement_timeout_s=r.placement_timeout_s,
                         reducer_capacity=_num_params(cfg), switch_addr=switch,
                         runtime_envs=_nsight_runtime_envs(cfg, layout),
                         on_restart=lambda error: (_restart_config(cfg), show_progress))
        results = run.results
        placement = layout.describe(with_reduction=False) + describe(run.layout, run.nodes,
                                                                     run.restarts)
    else:
        from gmi_drl.gmi.launcher import launch

        results = launch("gmi_drl.train:gmi_main", layout, machine, payload=payload,
                         reducer_capacity=_num_params(cfg), reduction=g.reducer,
                         switch_addrs=g.switch_addrs if g.reducer == "switch" else (),
                         netns=g.netns_list, prefixes=prefixes,
                         exit_timeout_s=600.0 if prefixes else 5.0)  # nsys writes reports at exit
        placement = layout.describe(with_reduction=g.reducer == "auto")
    digests = tuple(r.param_digests[0] for r in results)
    same = "yes" if len(set(digests)) == 1 else "NO (a bug: please report it)"
    with open(results[0].run_dir / "summary.md", "a") as f:
        reduction = ""
        if g.reducer == "switch":
            how = (f"asynchronously, staleness bound S = {g.staleness} (iSwitch §4.1)"
                   if g.staleness else "synchronously")
            reduction = (f"- gradients reduced through the aggregation switch at "
                         f"{g.switch_addr}, {how}\n")
        elif g.reducer == "ring":
            reduction = "- gradients reduced by one ring over all GMIs (gmi.reducer ring)\n"
        if g.netns is not None:
            reduction += f"- GMI k in network namespace k of {g.netns}\n"
        f.write(f"\n## GMI layout\n\n{placement}{reduction}"
                f"- weights identical on all {len(digests)} GMIs after every update: {same} "
                f"(sha256 {digests[0][:16]}...)\n")
    return results[0]._replace(param_digests=digests)


def _restart_config(cfg: TrainConfig) -> TrainConfig:
    """The config that restarts a failed multi-GMI run: resumed from its latest checkpoint, or
    from the start when none was written yet."""
    run_dir = resolve_checkpoint(cfg.resume).parent.parent if cfg.resume else Path(cfg.run_dir)
    ckpt = run_dir / "checkpoints" / "latest.pt"
    again = copy.deepcopy(cfg)
    again.run_dir, again.resume = str(run_dir), (str(ckpt) if ckpt.exists() else None)
    log.warning("restarting every GMI from %s", ckpt if ckpt.exists() else "the start")
    return again


def gmi_main(ctx) -> TrainResult:
    """One GMI's share of a multi-GMI run (the launcher's target)."""
    cfg, show_progress = ctx.payload
    on_progress = _print_progress if show_progress and ctx.gmi_id == 0 else None
    return _train_process(cfg, ctx.gmi_id, ctx.make_reducer(), on_progress)


def _print_progress(p: Progress) -> None:
    from gmi_drl.telemetry.progress import format_progress

    print(format_progress(p), flush=True)


def _num_params(cfg: TrainConfig) -> int:
    from gmi_drl import envs

    with envs.make(cfg.env.task_id, num_envs=1, num_workers=1) as pool:
        model = build_actor_critic(pool.observation_space, pool.action_space, cfg.model.encoder,
                                   cfg.model.actor_hidden, cfg.model.critic_hidden,
                                   cfg.model.activation)
    return sum(p.numel() for p in model.parameters())


def _train_process(cfg: TrainConfig, rank: int, reducer,
                   on_progress: Callable[[Progress], None] | None) -> TrainResult:
    """The loop of one process: the serial run (rank 0 of 1), or one GMI of many.

    Each top-level phase is ``prof.phase(name)``, the timer section ``name`` (and, when this
    GMI's profiler selects it, a capture range); ``prof.step`` and ``tree.iteration`` bracket
    each iteration (capture ranges end with the step, outside the timeline's record of it)."""
    run = _setup(cfg, rank, reducer)
    p, T = cfg.ppo, cfg.ppo.num_steps
    B = cfg.env.num_envs * cfg.gmi.num_gmis  # global_step counts the envs of every GMI
    first, prof = run.learner.iteration, run.profiler
    weights_chain = hashlib.sha256()  # over the weights after each update (GMIs compare it)
    t0 = time.perf_counter()
    try:
        for iteration in range(first, cfg.num_iterations):
            before = run.tree.snapshot_s()
            with prof.step(iteration), run.tree.iteration(iteration):
                with prof.phase("rollout"):
                    episodes = run.collector.collect(run.buf)
                with prof.phase("advantages"):
                    run.buf.compute_advantages(p.gamma, p.gae_lambda)
                with prof.phase("update"):
                    losses = run.learner.update(run.buf.flatten())
                    if run.sync_weights is not None:
                        run.sync_weights()
                    weights_chain.update(run.learner.flat.data.cpu().numpy().tobytes())
                global_step, last = (iteration + 1) * T * B, iteration + 1 == cfg.num_iterations
                with prof.phase("log"):
                    elapsed = time.perf_counter() - t0
                    run.record(episodes, global_step, elapsed)
                    if (iteration + 1) % cfg.log.log_every == 0 or last:
                        sps = (iteration + 1 - first) * T * B / elapsed
                        _log(cfg, run, global_step, episodes, losses, sps, elapsed, before,
                             on_progress)
                every = cfg.log.checkpoint_every
                if rank == 0 and ((every and (iteration + 1) % every == 0) or last):
                    with prof.phase("checkpoint"):
                        _save(cfg, run, global_step)
    finally:
        wall = time.perf_counter() - t0
        run.close()
    steps, returns = np.array(run.episode_steps, np.int64), np.array(run.episode_returns)
    digest = (weights_chain.hexdigest(),)
    if rank != 0:
        return TrainResult(run.run_dir, cfg.num_iterations * T * B, wall, steps, returns,
                           np.array(run.episode_wall_s), digest)
    summary = RunSummary(f"{cfg.algo.upper()} on {cfg.env.task_id} (seed {cfg.seed})",
                         cfg.num_iterations * T * B, wall, (cfg.num_iterations - first) * T * B,
                         steps, returns, run.tree.stats())
    log.info("wrote %s", write_summary(summary, run.run_dir))
    return TrainResult(run.run_dir, cfg.num_iterations * T * B, wall, steps, returns,
                       np.array(run.episode_wall_s), digest)


def _log(cfg: TrainConfig, run: _Run, global_step: int, episodes, losses: dict, sps: float,
         elapsed_s: float, before: dict[str, float],
         on_progress: Callable[[Progress], None] | None) -> None:
    metrics = dict(losses)
    if len(episodes.returns):
        metrics["env/episodic_return"] = float(episodes.returns.mean())
        metrics["env/episodic_length"] = float(episodes.lengths.mean())
    metrics["perf/sps"] = sps
    for path, total in run.tree.snapshot_s().items():
        metrics[f"perf/{path}_s"] = total - before.get(path, 0.0)
    if run.writer is not None:
        run.writer.log(global_step, metrics)
    if on_progress is not None:
        recent = np.mean(run.episode_returns[-20:]) if run.episode_returns else np.nan
        total = cfg.num_iterations * cfg.batch_size
        on_progress(Progress(global_step, total, sps, float(recent), elapsed_s))


def _setup(cfg: TrainConfig, rank: int, reducer) -> _Run:
    """Build one process's pool, model, learner and sinks. Every GMI seeds torch alike (identical
    initial weights); GMI ``k``'s envs get seeds ``seed + k * num_envs + i`` and its own action
    generator. GMIs other than 0 keep only their timeline, in ``<run_dir>/gmi-<k>/``; profiler
    outputs go to ``<run_dir>/profile/gmi-<k>/``."""
    torch.set_num_threads(cfg.torch_threads)
    threadpool_limits(cfg.torch_threads, user_api="blas")  # the NumPy learner's matmuls
    torch.manual_seed(cfg.seed)
    state = load_checkpoint(cfg.resume) if cfg.resume else None
    if state is not None:
        run_dir = resolve_checkpoint(cfg.resume).parent.parent
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        default = Path("runs") / f"{cfg.env.task_id.replace('/', '_')}-{cfg.algo}-{stamp}"
        run_dir = Path(cfg.run_dir) if cfg.run_dir else default
    cfg.run_dir, cfg.resume = str(run_dir), None
    profile_dir = run_dir / "profile" / f"gmi-{rank}"
    if rank == 0:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2) + "\n")
        log.info("run directory: %s", run_dir)
    else:
        run_dir = run_dir / f"gmi-{rank}"
        run_dir.mkdir(parents=True, exist_ok=True)

    start_step = int(state["global_step"]) if state else 0
    pool = make_pool(cfg, seed=cfg.seed + start_step + rank * cfg.env.num_envs)
    model = build_actor_critic(pool.observation_space, pool.action_space, cfg.model.encoder,
                               cfg.model.actor_hidden, cfg.model.critic_hidden,
                               cfg.model.activation)
    # with a GPU learner, the collector acts with a CPU copy that follows every update
    learner_model = model if cfg.device == "cpu" else copy.deepcopy(model).to(cfg.device)
    learner = PPO(cfg.ppo, learner_model, cfg.gmi_batch_size, cfg.num_iterations,
                  reducer=reducer, seed=cfg.seed, staleness_bound=cfg.gmi.staleness or None)
    sync = None if learner_model is model else _weight_sync(model, learner)
    p = cfg.ppo
    obs_norm = ObsNormalizer(pool.observation_space.shape, p.obs_clip) if p.norm_obs else None
    rew_norm = RewardNormalizer(cfg.env.num_envs, p.gamma, p.reward_clip) if p.norm_reward else None
    # a resumed GMI other than 0 continues with a generator of its own (the checkpoint holds
    # GMI 0's): GMIs never draw the same action noise
    action_rng = torch.Generator().manual_seed(cfg.seed + 1 + 7919 * rank + start_step)
    collector = Collector(pool, model, obs_norm, rew_norm, action_rng)
    steps, returns = [], []
    if state is not None:
        _restore(state, learner, collector, rank)
        if sync is not None:
            sync()
        steps, returns = state["episode_steps"].tolist(), state["episode_returns"].tolist()
        log.info("resumed from global_step %d", start_step)
    buf = RolloutBuffer(p.num_steps, cfg.env.num_envs, pool.observation_space, pool.action_space)
    tree = TimingTree(Timeline(cfg.log.timeline_detail_events, process_name=f"gmi-{rank}"))
    set_tree(tree)
    profiler = make_profiler(cfg.profile, rank, profile_dir, tree)
    writer = (MetricsWriter(run_dir, cfg.log.tensorboard, purge_step=start_step or None)
              if rank == 0 else None)
    return _Run(run_dir, pool, model, learner, collector, buf, writer, tree, profiler, steps,
                returns, [0.0] * len(steps), rank, sync)


def _weight_sync(model: ActorCritic, learner: PPO) -> Callable[[], None]:
    """Copy the learner's (GPU) flat weights into the acting (CPU) model: one transfer."""
    from gmi_drl.algos.flat import FlatParams

    acting = FlatParams(model)

    def sync() -> None:
        acting.data.copy_(learner.flat.data)
    return sync


def _save(cfg: TrainConfig, run: _Run, global_step: int) -> None:
    c = run.collector
    save_checkpoint(run.run_dir / "checkpoints" / "latest.pt", {
        "config": to_dict(cfg), "global_step": global_step,
        "learner": run.learner.state_dict(),
        "obs_norm": c.obs_norm.state_dict() if c.obs_norm else None,
        "reward_norm": c.reward_norm.state_dict() if c.reward_norm else None,
        "action_rng": c.generator.get_state(), "rng": torch.get_rng_state(),
        "episode_steps": torch.tensor(run.episode_steps, dtype=torch.int64),
        "episode_returns": torch.tensor(run.episode_returns, dtype=torch.float64),
    })


def _restore(state: dict, learner: PPO, collector: Collector, rank: int = 0) -> None:
    """Load learner, normalisers and RNGs from a checkpoint (the action generator on GMI 0 only:
    it is GMI 0's).

    Raises:
        CheckpointError: the checkpoint does not fit this model or normaliser layout.
    """
    from gmi_drl.checkpoint import CheckpointError

    try:
        learner.load_state_dict(state["learner"])
        for name in ("obs_norm", "reward_norm"):
            norm = getattr(collector, name)
            if (norm is None) != (state[name] is None):
                raise ValueError(f"{name} is {'on' if norm else 'off'} in this config but "
                                 f"{'off' if norm else 'on'} in the checkpoint")
            if norm is not None:
                norm.load_state_dict(state[name])
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint does not match this run: {e}") from None
    if rank == 0:
        collector.generator.set_state(state["action_rng"])
    torch.set_rng_state(state["rng"])
