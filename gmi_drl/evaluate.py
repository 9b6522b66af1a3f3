"""Evaluate a checkpoint: mean/std episode return, and optionally a video of one episode."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from gmi_drl.checkpoint import CheckpointError, load_checkpoint, resolve_checkpoint
from gmi_drl.config import from_dict
from gmi_drl.models.actor_critic import ActorCritic, build_actor_critic
from gmi_drl.rollout.normalize import ObsNormalizer

log = logging.getLogger(__name__)


class EvalReport(NamedTuple):
    """Episodes of one evaluation."""

    returns: np.ndarray
    """``(episodes,) float64`` undiscounted returns"""
    lengths: np.ndarray
    """``(episodes,) int64``"""
    video_path: Path | None


def load_policy(path: str | Path) -> tuple[dict, ActorCritic, ObsNormalizer | None]:
    """``(checkpoint, model, frozen obs normaliser or None)`` from a run dir or checkpoint file.

    Raises:
        CheckpointError: missing/corrupt file, or weights that do not fit the stored config.
    """
    state = load_checkpoint(path)
    cfg = from_dict(state["config"])
    import gymnasium as gym

    from gmi_drl import envs

    probe = envs.make(cfg.env.task_id, 1, num_workers=1) if cfg.env.task_id in envs.list_tasks() \
        else gym.make(cfg.env.task_id)
    obs_space, act_space = probe.observation_space, probe.action_space
    probe.close()
    model = build_actor_critic(obs_space, act_space, cfg.model.encoder, cfg.model.actor_hidden,
                               cfg.model.critic_hidden, cfg.model.activation)
    try:
        model.load_state_dict(state["learner"]["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{resolve_checkpoint(path)}: weights do not fit the model of its "
                              f"config: {e}") from None
    obs_norm = None
    if state["obs_norm"] is not None:
        obs_norm = ObsNormalizer(obs_space.shape, cfg.ppo.obs_clip)
        obs_norm.load_state_dict(state["obs_norm"])
    return state, model.eval(), obs_norm


@torch.inference_mode()
def evaluate(path: str | Path, episodes: int = 10, deterministic: bool = True, seed: int = 10_000,
             num_envs: int = 4, video: bool = False) -> EvalReport:
    """Run ``episodes`` full episodes of the checkpoint's policy on its task.

    Episodes are spread over ``min(num_envs, episodes)`` envs, each env contributing a fixed
    quota of its first episodes (no bias towards short episodes). ``deterministic`` takes the
    policy's mode (Gaussian mean, arg-max) instead of sampling. Observations pass through the
    normaliser saved with the checkpoint, frozen. With ``video``, one further episode is rendered
    (``rgb_array``) and written next to the checkpoint's run (``eval.mp4`` with imageio-ffmpeg,
    else ``eval.gif``); skipped, with a log message, when the task does not render or imageio is
    absent.

    Raises:
        CheckpointError: see `load_policy`. ValueError: ``episodes < 1``.
    """
    if episodes < 1:
        raise ValueError(f"episodes={episodes} must be >= 1")
    from gmi_drl.config import TrainConfig
    from gmi_drl.train import make_pool

    state, model, obs_norm = load_policy(path)
    cfg: TrainConfig = from_dict(state["config"])
    n = min(num_envs, episodes)
    cfg.env.num_envs, cfg.env.num_workers, cfg.serial = n, None, True
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)
    returns: list[list[float]] = [[] for _ in range(n)]
    lengths: list[list[int]] = [[] for _ in range(n)]
    pool = make_pool(cfg, seed)
    try:
        obs, _ = pool.reset()
        while any(len(r) < q for r, q in zip(returns, quota)):
            action = _act(model, obs_norm, obs, pool.action_space, deterministic)
            obs, _, term, trunc, info = pool.step(action)
            for i in np.flatnonzero(info["episode_end"]):
                if len(returns[i]) < quota[i]:
                    returns[i].append(float(info["episode_return"][i]))
                    lengths[i].append(int(info["episode_length"][i]))
    finally:
        pool.close()
    video_path = _record(cfg.env.task_id, model, obs_norm, deterministic, seed,
                         resolve_checkpoint(path).parent.parent) if video else None
    return EvalReport(np.array(sum(returns, [])), np.array(sum(lengths, []), np.int64), video_path)


def _act(model, obs_norm, obs, space, deterministic) -> np.ndarray:
    if obs_norm is not None:
        obs = obs_norm(obs, update=False)
    x = torch.from_numpy(obs if obs.dtype == np.uint8 else obs.astype(np.float32))
    action = model.act(x, deterministic=deterministic).action.numpy()
    if hasattr(space, "low"):
        action = np.clip(action, space.low, space.high).astype(space.dtype)
    return action


def _record(task_id, model, obs_norm, deterministic, seed, out_dir: Path) -> Path | None:
    import gymnasium as gym

    if importlib.util.find_spec("imageio") is None:
        log.warning("video skipped: the 'imageio' package is not installed")
        return None
    import imageio.v2 as imageio

    try:
        env = gym.make(task_id, render_mode="rgb_array")
        obs, _ = env.reset(seed=seed)
        env.render()
    except Exception as e:  # noqa: BLE001 - a task that cannot render gets no video, only a note
        log.warning("video skipped: %s cannot render rgb_array (%s)", task_id, e)
        return None
    frames = []
    done = False
    while not done:
        frames.append(env.render())
        action = _act(model, obs_norm, obs[None], env.action_space, deterministic)[0]
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
