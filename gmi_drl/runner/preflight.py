"""Checks that need the task, made by the controller before a run writes anything: the
algorithm built once on the CPU from the task's spaces (`preflight`), which a resumed checkpoint
is then loaded into (`gmi_drl.runner.resume.Resume.check`). `gmi_drl.config.validate` checks
what the config alone can tell.
"""

from __future__ import annotations

import functools
import logging
import os

from gmi_drl.config import ConfigError, TrainConfig


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

    spec = envs.task_spec(cfg.env.task_id, **cfg.env.pool_kwargs())
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
    GPU's free memory (NVML, no CUDA context in the controller) for the GMIs placed on it. Warn
    where a CPU run's buffers exceed the memory available now (``MemAvailable``: the kernel
    hands out pages as they are written). The message says how many transitions per GMI would
    fit. The buffers are allocated only once a run collects, after its directory is written.
    GPUs split into MIG instances are not checked (a slice's size is the backend's to know).

    Raises:
        ConfigError: the buffers need more bytes than the device has (free, on a GPU).
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
        gmis = math.ceil(cfg.gmi.num_gmis / len(gpus))
        total = min(g.memory_free_bytes or g.memory_bytes for g in gpus)
        where, kind, free = "GPU", "free", None
    else:
        gmis, where, kind = cfg.gmi.num_gmis, "machine", ""
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        free = _mem_available()
    need = per_gmi * gmis
    what = (f"algo.buffer_size={size:,} transitions of {cfg.env.task_id} take "
            f"{per_gmi / 2**30:,.1f} GiB per GMI" + (f", {need / 2**30:,.1f} GiB for the {gmis} "
                                                     f"GMIs of a {where}" if gmis > 1 else ""))
    fits = int(total / gmis / (per_gmi / size)) if size else 0
    if need > total:
        raise ConfigError(f"{what}: more than this {where}'s {total / 2**30:,.1f} GiB"
                          f"{' ' + kind if kind else ''}; at most {fits:,} transitions per GMI "
                          "fit: lower --algo.buffer-size")
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
