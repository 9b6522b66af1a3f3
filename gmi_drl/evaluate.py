"""Evaluate a checkpoint: mean/std episode return, and optionally a video of one episode."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gmi_drl.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from gmi_drl.config import TrainConfig, from_dict
from gmi_drl.rollout.acting import Acting
from gmi_drl.rollout.normalize import ObsNormalizer

log = logging.getLogger(__name__)


class EvalReport(NamedTuple):
    """Episodes of one evaluation."""

    returns: np.ndarray
    """``(episodes,) float64`` undiscounted returns"""
    lengths: np.ndarray
    """``(episodes,) int64``"""
    video_path: Path | None


def load_policy(path: str | Path, seed: int = 0
                ) -> tuple[TrainConfig, Acting, ObsNormalizer | None]:
    """``(config, policy, frozen obs normaliser or None)`` of a run dir or checkpoint file: the
    run's algorithm built on the CPU (the same builder as training) with the checkpoint's
    weights; the policy samples with a generator seeded ``seed``.

    Raises:
        CheckpointError: missing/corrupt file, or weights that do not fit the stored config.
    """
    import functools

    from gmi_drl import envs
    from gmi_drl.algos import AlgoContext, build_algorithm
    from gmi_drl.optim.grad_step import make_grad_step

    state = load_checkpoint(path)
    missing = [k for k in ("config", "algo", "obs_norm") if k not in state]
    if missing:
        raise CheckpointError(f"{resolve_checkpoint(path)}: not a usable checkpoint: it has no "
                              f"{', '.join(missing)} (a gmi-drl checkpoint holds config, algo "
                              "and obs_norm)")
    try:  # the fields and their types only: where it trained (a GPU, Ray) need not exist here
        cfg = from_dict(state["config"])
    except (TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{resolve_checkpoint(path)}: not a usable checkpoint: its config "
                              f"does not hold: {e}") from None
    try:
        spec = envs.task_spec(cfg.env.task_id)
    except ValueError as e:  # a task registered by code of the training process, not this one
        raise CheckpointError(f"{resolve_checkpoint(path)}: its task cannot be made here: {e} "
                              "(a task registered with gmi_drl.envs.register must be registered "
                              "again, or its package installed, before eval)") from None
    ctx = AlgoContext(spec, cfg.env.num_envs, cfg.model, cfg.num_iterations, cfg.seed,
                      functools.partial(make_grad_step, compile=False),  # (schedules: as trained)
                      torch.Generator().manual_seed(seed))
    algo = build_algorithm(cfg.algo, ctx)
    try:  # (a saved replay buffer is no part of the policy: not loaded)
        algo.load_state_dict({k: v for k, v in state["algo"].items() if k != "replay"})
        obs_norm = None
        if state["obs_norm"] is not None:
            obs_norm = ObsNormalizer(spec.observation_space.shape, cfg.norm.obs_clip)
            obs_norm.load_state_dict(state["obs_norm"])
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
        raise CheckpointError(f"{resolve_checkpoint(path)}: weights do not fit the model of its "
                              f"config: {e}") from None
    return cfg, algo.acting, obs_norm


@torch.inference_mode()
def evaluate(path: str | Path, episodes: int = 10, deterministic: bool = True, seed: int = 10_000,
             num_envs: int = 4, video: bool = False) -> EvalReport:
    """Run ``episodes`` full episodes of the checkpoint's policy on its task.

    Episodes are spread over ``min(num_envs, episodes)`` envs, each env contributing a fixed
    quota of its first episodes (no bias towards short episodes). ``deterministic`` takes the
    policy's mode (Gaussian mean, arg-max) instead of sampling (DQN: epsilon-greedy at the
    epsilon its schedule had reached at the checkpoint). Observations pass through the
    normaliser saved with the checkpoint, frozen. With ``video``, one further episode is rendered
    (``rgb_array``) and written into the checkpoint's run directory, or beside a checkpoint
    that lies outside one (``eval.mp4`` with imageio-ffmpeg, else ``eval.gif``); skipped, with
    a log message, when the task does not render or imageio is absent.

    Raises:
        CheckpointError: see `load_policy`. ValueError: ``episodes`` or ``num_envs`` not an int
            >= 1, or ``seed`` not an int in [0, 2**31).
    """
    def whole(x) -> bool:
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

    bad = [msg for ok, msg in (
        (whole(episodes) and episodes >= 1, f"episodes={episodes!r} must be an int >= 1"),
        (whole(num_envs) and num_envs >= 1, f"num_envs={num_envs!r} must be an int >= 1"),
        (whole(seed) and 0 <= seed < 2**31, f"seed={seed!r} must be an int in [0, 2**31)"))
        if not ok]
    if bad:
        raise ValueError("; ".join(bad))
    from gmi_drl import envs

    cfg, acting, obs_norm = load_policy(path, seed)
    n = min(num_envs, episodes)
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    returns: list[list[float]] = [[] for _ in range(n)]
    lengths: list[list[int]] = [[] for _ in range(n)]
    limit = ({} if cfg.env.max_episode_steps is None
             else {"max_episode_steps": cfg.env.max_episode_steps})  # (the run's time limit)
    with envs.make(cfg.env.task_id, n, num_workers=0, seed=seed, autoreset="same_step",
                   **limit) as pool:
        obs, _ = pool.reset()
        while any(len(r) < q for r, q in zip(returns, quota)):
            action = _act(acting, obs_norm, obs, pool.action_space, deterministic)
            obs, _, term, trunc, info = pool.step(action)
            for i in np.flatnonzero(info["episode_end"]):
                if len(returns[i]) < quota[i]:
                    returns[i].append(float(info["episode_return"][i]))
                    lengths[i].append(int(info["episode_length"][i]))
    video_path = _record(cfg.env.task_id, acting, obs_norm, deterministic, seed,
                         _video_dir(resolve_checkpoint(path)), limit) if video else None
    return EvalReport(np.array(sum(returns, [])), np.array(sum(lengths, []), np.int64), video_path)


def _render_hint(task_id: str) -> str:
    """What usually makes ``task_id`` render, for the skip message (Gymnasium's own message
    already names the package a classic-control task lacks)."""
    from gmi_drl.config import task_family

    if task_family(task_id) == "mujoco" and not os.environ.get("MUJOCO_GL"):
        return "; on a machine without a display, set MUJOCO_GL=egl"
    return ""


def _video_dir(checkpoint: Path) -> Path:
    """Where ``eval --video`` writes: the run directory of a checkpoint in its
    ``checkpoints/``, else the folder the checkpoint lies in."""
    folder = checkpoint.parent
    return folder.parent if folder.name == "checkpoints" else folder


def _act(acting: Acting, obs_norm, obs, space, deterministic) -> np.ndarray:
    if obs_norm is not None:
        obs = obs_norm(obs, update=False)
    x = obs if obs.dtype == np.uint8 else obs.astype(np.float32)
    action = np.asarray(acting.act(x, deterministic).action)
    if hasattr(space, "low"):
        action = np.clip(action, space.low, space.high).astype(space.dtype)
    return action


def _record(task_id, acting, obs_norm, deterministic, seed, out_dir: Path,
            limit: dict | None = None) -> Path | None:
    import gymnasium as gym

    if importlib.util.find_spec("imageio") is None:
        log.warning("video skipped: the 'imageio' package is not installed")
        return None
    import imageio.v2 as imageio

    from gmi_drl.envs.warp import tasks as warp_tasks

    if task_id in warp_tasks():
        log.warning("video skipped: the warp engine's tasks (%s) do not render", task_id)
        return None
    try:
        env = gym.make(task_id, render_mode="rgb_array", **(limit or {}))
        obs, _ = env.reset(seed=seed)
        env.render()
    except Exception as e:  # noqa: BLE001 - a task that cannot render gets no video, only a note
        log.warning("video skipped: %s cannot render rgb_array (%s)%s", task_id, e,
                    _render_hint(task_id))
        return None
    frames = []
    done = False
    while not done:
        frames.append(env.render())
        action = _act(acting, obs_norm, obs[None], env.action_space, deterministic)[0]
        obs, _, term, trunc, _ = env.step(action)
        done = term or trunc
    env.close()
    fps = env.metadata.get("render_fps", 30)
    if importlib.util.find_spec("imageio_ffmpeg") is not None:
        path = out_dir / "eval.mp4"
        imageio.mimsave(path, frames, fps=fps)
    else:
        path = out_dir / "eval.gif"
        imageio.mimsave(path, frames[::2], duration=2000 / fps, loop=0)
    return path
