"""Checks that need the task or the checkpoint, made by the controller before a run writes
anything: the algorithm built once on the CPU from the task's spaces (`preflight`), and a
resumed checkpoint loaded into that build (`check_resumable`). `gmi_drl.config.validate` checks
what the config alone can tell.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

from gmi_drl.checkpoint import run_dir_of
from gmi_drl.config import ConfigError, TrainConfig, from_dict, resume_conflicts


def build_on_cpu(cfg: TrainConfig, norms: bool = False):
    """``cfg``'s algorithm built on the CPU from the task's spec, untrained and uncompiled;
    with ``norms`` also given the normalisers ``cfg.norm`` asks for.

    Raises:
        ValueError, TypeError, ImportError, gymnasium.error.Error: what the task or the
            algorithm's constructor raise (an action space it does not take, a missing
            dependency of the env, observations the encoder does not fit).
    """
    import torch

    from gmi_drl import envs
    from gmi_drl.algos import AlgoContext, build_algorithm
    from gmi_drl.optim.grad_step import make_grad_step
    from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer

    spec = envs.task_spec(cfg.env.task_id, engine=cfg.env.engine)
    n = cfg.norm
    obs_norm = (ObsNormalizer(spec.observation_space.shape, n.obs_clip) if norms and n.obs
                else None)
    reward_norm = (RewardNormalizer(cfg.env.num_envs, cfg.algo.gamma, n.reward_clip)
                   if norms and n.reward else None)
    ctx = AlgoContext(spec, cfg.env.num_envs, cfg.model, 1, cfg.seed,
                      functools.partial(make_grad_step, compile=False), torch.Generator(),
                      obs_norm=obs_norm, reward_norm=reward_norm)
    return build_algorithm(cfg.algo, ctx)


def _on_controller(cfg: TrainConfig) -> bool:
    """Whether this process can build the task: not with Ray, whose GMIs may run on nodes
    that have the task's dependencies where the head node has not."""
    return cfg.placement != "ray"


def preflight(cfg: TrainConfig):
    """The algorithm of ``cfg`` built once (`build_on_cpu`), so that what only the task can
    tell is found before the run directory is written; ``None`` on Ray (`_on_controller`).

    Raises:
        ConfigError: the algorithm cannot run on the task (the message is the cause's), its
            networks or buffers do not fit in memory, or its replay buffers would not
            (`check_replay_memory`).
    """
    import gymnasium as gym

    from gmi_drl.envs import list_tasks

    if not _on_controller(cfg):
        return None
    try:
        algo = build_on_cpu(cfg, norms=True)
    except (MemoryError, RuntimeError) as e:
        if not isinstance(e, MemoryError) and "allocate" not in str(e):
            raise
        raise ConfigError(f"{cfg.algo_name} on {cfg.env.task_id}: its networks and buffers do "
                          f"not fit in memory ({_first_line(e)}); lower the sizes: "
                          "--model.actor-hidden, --model.critic-hidden, --model.cnn-features, "
                          "--env.num-envs, --algo.num-steps") from None
    except (ValueError, TypeError, ImportError, gym.error.Error) as e:
        task = cfg.env.task_id
        hint = ""
        if task.startswith("ALE/") and task[4:] in list_tasks():
            hint = (f" (gmi-drl's Atari tasks drop the ALE/ prefix: --env.task-id {task[4:]} "
                    "is the game with the standard Atari preprocessing)")
        raise ConfigError(f"{cfg.algo_name} cannot run this config on {task}: "
                          f"{_first_line(e)}{hint}") from None
    check_replay_memory(cfg, algo.ctx.spec)
    return algo


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def check_replay_memory(cfg: TrainConfig, spec) -> None:
    """Refuse replay buffers (``algo.buffer_size`` transitions, one per GMI) larger than the
    memory of the device that holds them: this machine's RAM for every GMI of a CPU run; each
    GPU's memory (NVML, no CUDA context in the controller) for the GMIs placed on it. Warn
    where a CPU run's buffers exceed the memory available now (``MemAvailable``). The buffers
    are allocated only once a run collects, after its directory is written. GPUs split into
    MIG instances are not checked (a slice's size is the backend's to know).

    Raises:
        ConfigError: the buffers need more bytes than the device has.
    """
    import math

    from gmi_drl.rollout.replay import replay_nbytes

    size = getattr(cfg.algo, "buffer_size", None)
    if size is None:
        return
    per_gmi = replay_nbytes(size, spec, cfg.env.num_envs)
    if cfg.device == "cuda":
        from gmi_drl.gmi.devices import discover

        gpus = discover().gpus[:cfg.gmi.num_devices or None]
        if not gpus or any(g.mig_enabled or not g.memory_bytes for g in gpus):
            return
        gmis, total = math.ceil(cfg.gmi.num_gmis / len(gpus)), min(g.memory_bytes for g in gpus)
        where, free = "GPU", None
    else:
        gmis, where = cfg.gmi.num_gmis, "machine"
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        free = _mem_available()
    need = per_gmi * gmis
    what = (f"algo.buffer_size={size:,} transitions of {cfg.env.task_id} take "
            f"{per_gmi / 2**30:,.1f} GiB per GMI" + (f", {need / 2**30:,.1f} GiB for the {gmis} "
                                                     f"GMIs of a {where}" if gmis > 1 else ""))
    if need > total:
        raise ConfigError(f"{what}: more than this {where}'s {total / 2**30:,.1f} GiB; lower "
                          "--algo.buffer-size")
    if free is not None and need > free:
        logging.getLogger(__name__).warning("%s: more than the %.1f GiB available on this "
                                            "machine now", what, free / 2**30)


def _mem_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (free memory and reclaimable cache), or
    ``None`` where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def edited_config_json(ckpt: Path, stored: TrainConfig) -> Path | None:
    """``RUN/config.json`` of the run that holds checkpoint ``ckpt`` when the config it holds
    differs from ``stored`` (the checkpoint's own) in what the run does, not where it ran
    (``run_dir``, ``resume``, ``config``); ``None`` where they agree or there is no such file
    that loads."""
    import dataclasses

    run_dir = run_dir_of(ckpt)
    on_disk = None if run_dir is None else _config_json(run_dir / "config.json", stored)
    if on_disk is None:
        return None
    where = dict(run_dir=None, resume=None, config=None)
    same = dataclasses.replace(on_disk, **where) == dataclasses.replace(stored, **where)
    return None if same else run_dir / "config.json"


def _config_json(path: Path, stored: TrainConfig | None = None) -> TrainConfig | None:
    """The config of a run's ``config.json``, laid over ``stored`` (the checkpoint's config,
    as a resume reads it: `gmi_drl.config.overlay`) where given; ``None`` where there is no
    such file that loads."""
    import json

    from gmi_drl.config import overlay, to_dict

    try:
        data = json.loads(path.read_text())
        return from_dict(data if stored is None else overlay(to_dict(stored), data))
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return None  # (ConfigError is a ValueError)


def check_resumable(cfg: TrainConfig, ckpt: Path, state: dict, algo=None) -> None:
    """Refuse a resume that the checkpoint ``ckpt`` (loaded: ``state``) cannot serve: a config
    that changes what it carries (`resume_conflicts`), a replay buffer of another size, a run
    already at ``cfg``'s last iteration, or, where ``algo`` (`preflight`'s build) is given,
    weights or optimizer state that do not load into it (a dry run of the GMIs' load; a saved
    replay buffer is left out of it).

    Raises:
        ConfigError: what does not fit, and what to do instead.
    """
    try:
        stored = from_dict(state["config"])
    except (ConfigError, KeyError, TypeError) as e:
        raise ConfigError(f"{ckpt}: its config does not load ({e})") from None
    conflicts = resume_conflicts(stored, cfg)
    saved = state.get("algo", {})
    size = getattr(cfg.algo, "buffer_size", None)
    if "replay" in saved and size != getattr(stored.algo, "buffer_size", None):
        conflicts.append(f"algo.buffer_size={size} (the saved replay buffer holds "
                         f"{stored.algo.buffer_size})")
    if not conflicts and algo is not None:
        try:
            algo.load_state_dict({k: v for k, v in saved.items() if k != "replay"})
        except (ValueError, KeyError, RuntimeError, TypeError) as e:
            conflicts.append(f"its weights or optimizer state ({str(e).splitlines()[0]})")
    run_dir = run_dir_of(ckpt)
    if conflicts:
        changed = edited_config_json(ckpt, stored)
        on_disk = None if changed is None else _config_json(changed)
        other = None if on_disk is None else on_disk.algo_name
        if other is not None and other != stored.algo_name:
            raise ConfigError(f"--resume {cfg.resume}: {ckpt} holds a {stored.algo_name} run, "
                              f"but {changed} is a {other} run: the checkpoint came from "
                              f"another run. Move it out of {ckpt.parent} (the newest "
                              "checkpoint of this run is used then)")
        edited = ("" if changed is None else
                  f"; with no such flag given, {changed} differs from "
                  "the checkpoint's own config: restore it, or delete it and the checkpoint's "
                  "copy is used")
        raise ConfigError(f"--resume {cfg.resume}: the checkpoint cannot continue with "
                          + "; ".join(conflicts) + ". Drop the flags that changed them (a "
                          "resumed run keeps its task, model, normalisers, optimizer and env "
                          f"steps per iteration), or start a new run{edited}")
    if int(state["iteration"]) >= cfg.num_iterations:
        raise ConfigError(f"--resume {cfg.resume}: the run is already at "
                          f"{int(state['global_step']):,} env steps, iteration "
                          f"{int(state['iteration'])} of the {cfg.num_iterations} that "
                          f"total_timesteps={cfg.total_timesteps:,} allows; raise "
                          "--total-timesteps to train on"
                          + (" (it was stopped after its last checkpoint, before summary.md; "
                             "metrics.csv holds its whole learning curve)"
                             if int(state["iteration"]) >= stored.num_iterations
                             and run_dir is not None
                             and not (run_dir / "summary.md").exists() else ""))
    first = int(state["iteration"])
    if cfg.profile.tool != "none" and max(cfg.profile.iterations, default=-1) < first:
        # a warning, not a refusal: a profiled run resumed as it was keeps its old iterations
        logging.getLogger(__name__).warning(
            "profile.iterations %s all ran before this resume starts at iteration %d: this "
            "invocation captures nothing; name later ones with --profile.iterations",
            cfg.profile.iterations, first)
