"""Task registry and `make`: which implementation runs a task, and how a pool is built.

Native tasks (vectorised NumPy classic control, MuJoCo on its own thread pool, Atari through
ale-py's C++ vector env) run in the pool's process; every other Gymnasium id and every user
callable runs through the generic path (worker processes over shared memory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from gmi_drl.envs.engine import Engine, LocalEngine
from gmi_drl.envs.batched import BatchedEnv, GymnasiumBatch
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import AutoresetMode, EnvSpec, env_seeds
from gmi_drl.envs.stepper import Slots, Stepper
from gmi_drl.envs.workers import ProcessEngine

BatchedFactory = Callable[..., BatchedEnv]
# An engine that brings its own autoreset (the C++ cores, ale-py's vector env): (spec, Engine).
EngineFactory = Callable[..., tuple[EnvSpec, Engine]]
# A whole pool in native code (CartPole-v1): returns an `EnvPool`.
PoolFactory = Callable[..., EnvPool]


@dataclass(frozen=True)
class TaskEntry:
    """How to build one task.

    Exactly one of ``batched``, ``engine``, ``pool`` and ``env_fn`` is set:
        batched: ``batched(num_envs, num_threads, **kwargs) -> BatchedEnv``, stepped in-process
            (vectorised NumPy tasks).
        engine: ``engine(num_envs, env_batch_size, num_threads, seeds, autoreset, **kwargs)``
            (``seeds``: `env_seeds`)
            returning ``(EnvSpec, Engine)``, for engines with their own autoreset.
        pool: the same arguments, returning a whole `EnvPool` (a pool in C++).
        env_fn: a Gymnasium id or ``env_fn(**kwargs) -> gymnasium.Env``, run in worker processes.
    max_episode_steps: time limit the pool applies to a batched task (``None``: none, or the
        env's own).
    """

    task_id: str
    batched: BatchedFactory | None = None
    engine: EngineFactory | None = None
    pool: PoolFactory | None = None
    env_fn: str | Callable[..., gym.Env] | None = None
    max_episode_steps: int | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    on_device: bool = False
    """the pool factory takes ``device=`` (engines that simulate on a device: warp)"""


_REGISTRY: dict[str, TaskEntry] = {}


def register(task_id: str, env_fn: str | Callable[..., gym.Env] | None = None, *,
             batched: BatchedFactory | None = None, engine: EngineFactory | None = None,
             pool: PoolFactory | None = None, max_episode_steps: int | None = None,
             on_device: bool = False, **kwargs: Any) -> None:
    """Register ``task_id``; `make` then builds pools of it.

    Args:
        task_id: the name to make it by.
        env_fn: a Gymnasium id, or a callable returning a ``gymnasium.Env`` (generic path).
        batched: a `BatchedEnv` factory (stepped in-process), instead of ``env_fn``.
        engine: a factory of ``(EnvSpec, Engine)`` (engines with their own autoreset).
        pool: a factory of a whole `EnvPool` (pools in C++).
        max_episode_steps: pool-applied time limit for batched tasks.
        on_device: the ``pool`` factory takes ``device=`` (`make` passes it on).
        **kwargs: default keyword arguments for the factory.

    Raises:
        ValueError: not exactly one of ``env_fn``, ``batched``, ``engine``, ``pool`` given.
    """
    if sum(x is not None for x in (env_fn, batched, engine, pool)) != 1:
        raise ValueError(f"register({task_id!r}): give exactly one of env_fn, batched, engine, "
                         "pool")
    _REGISTRY[task_id] = TaskEntry(task_id, batched, engine, pool, env_fn, max_episode_steps,
                                   kwargs, on_device)


def task_spec(task_id: str) -> EnvSpec:
    """The `EnvSpec` of ``task_id`` (its spaces), without simulating: the warp tasks read it from
    their definition; other tasks from a one-env pool made in this process.

    Raises:
        ValueError: unknown ``task_id``.
    """
    _register_builtin()
    entry = _REGISTRY.get(task_id)
    if entry is not None and entry.on_device:
        return entry.pool.spec()
    with make(task_id, 1, num_workers=0) as pool:
        return pool.spec


def list_tasks() -> list[str]:
    """Task ids registered with gmi-drl (any other Gymnasium id also works, generically)."""
    _register_builtin()
    return sorted(_REGISTRY)


def make(task_id: str, num_envs: int, env_batch_size: int | None = None,
         num_workers: int | None = None, seed: int | Sequence[int] = 0,
         autoreset: str | AutoresetMode = "next_step", device: str | None = None,
         **task_kwargs: Any) -> EnvPool:
    """Build an `EnvPool` of ``num_envs`` sub-environments of ``task_id``.

    Args:
        task_id: a registered task (`list_tasks`) or any Gymnasium id.
        num_envs: sub-environments in the pool.
        env_batch_size: envs returned per `EnvPool.recv`; ``None`` means ``num_envs``
            (synchronous). Must be in ``[1, num_envs]``.
        num_workers: threads (native tasks) or processes (generic path); ``None``: the CPU
            cores this process may use, at most ``num_envs``; ``0`` steps the generic path in
            this process (no worker processes: what the serial placement uses).
        seed: env ``i`` is first reset with seed ``seed + i`` (as ``gymnasium.Env.reset(seed=)``),
            or with ``seed[i]`` for a sequence of ``num_envs`` ints (`env_seeds`); later resets
            continue that env's generator.
        autoreset: ``"next_step"``, ``"same_step"`` or ``"disabled"`` (see `AutoresetMode`).
        device: where a device engine simulates and returns its tensors (``"cuda:0"``; the warp
            engine, ``None``: ``"cpu"``); the CPU engines ignore it and return NumPy.
        **task_kwargs: passed to the task's constructor (e.g. ``frame_skip``), among them
            ``engine``, one vocabulary for every task: ``"auto"`` (the fastest built here),
            ``"native"`` (C++: CartPole-v1, the MuJoCo v5 locomotion tasks, Atari),
            ``"numpy"`` (vectorised NumPy: CartPole-v1, MuJoCo v5), ``"ale"`` (ale-py's vector
            envs: Atari), ``"warp"`` (MuJoCo Warp: the ``*-gmi-v0`` tasks); a task given an
            engine it does not have raises ``ValueError`` naming the ones it has.

    Raises:
        ValueError: unknown ``task_id`` or an invalid size, mode or keyword (all named at once).
    """
    _register_builtin()
    errors = []
    if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
        errors.append(f"num_envs={num_envs!r} must be an int >= 1")
        num_envs = 1
    batch = num_envs if env_batch_size is None else env_batch_size
    if not isinstance(batch, (int, np.integer)) or not 1 <= batch <= num_envs:
        errors.append(f"env_batch_size={env_batch_size!r} must be in [1, num_envs={num_envs}]")
    cores = len(os.sched_getaffinity(0))
    workers = min(num_envs, cores) if num_workers is None else num_workers
    if not isinstance(workers, (int, np.integer)) or not 0 <= workers <= num_envs:
        errors.append(f"num_workers={num_workers!r} must be in [0, num_envs={num_envs}]")
    try:
        mode = AutoresetMode(autoreset)
    except ValueError:
        errors.append(f"autoreset={autoreset!r} must be one of "
                      f"{[m.value for m in AutoresetMode]}")
    entry = _REGISTRY.get(task_id)
    if entry is None:
        if task_id in gym.registry:
            entry = TaskEntry(task_id, env_fn=task_id)
        else:
            errors.append(f"task_id={task_id!r} is neither registered (gmi_drl.envs.list_tasks()) "
                          "nor a Gymnasium id")
    try:
        seeds = env_seeds(seed, num_envs)
    except ValueError as e:
        errors.append(str(e))
    if errors:
        raise ValueError("invalid pool: " + "; ".join(errors))
    kwargs = {**entry.kwargs, **task_kwargs}
    if entry.on_device:
        kwargs["device"] = device or "cpu"
    if entry.pool is not None:
        return entry.pool(num_envs=num_envs, env_batch_size=batch, num_threads=max(workers, 1),
                          seeds=seeds, autoreset=mode, **kwargs)
    if entry.engine is not None:
        spec, engine = entry.engine(num_envs=num_envs, env_batch_size=batch,
                                    num_threads=max(workers, 1), seeds=seeds, autoreset=mode,
                                    **kwargs)
    elif entry.batched is not None:
        env = entry.batched(num_envs=num_envs, num_threads=max(workers, 1), **kwargs)
        spec = EnvSpec(task_id, env.observation_space, env.action_space, entry.max_episode_steps)
        slots = Slots.allocate(num_envs, env.observation_space.shape, env.observation_space.dtype)
        engine = LocalEngine(Stepper(env, slots, mode, entry.max_episode_steps, seeds))
    else:
        spec, engine = _generic(task_id, entry.env_fn, kwargs, num_envs, workers, mode, seeds)
    return EnvPool(spec, engine, num_envs, batch, mode)


def _generic(task_id, env_fn, kwargs, num_envs, workers, mode, seeds):
    if isinstance(env_fn, str):
        gym_id = env_fn

        def make_one() -> gym.Env:
            return gym.make(gym_id, **kwargs)
    else:
        def make_one() -> gym.Env:
            return env_fn(**kwargs)

    probe = make_one()
    try:
        obs_space, act_space = probe.observation_space, probe.action_space
    finally:
        probe.close()
    spec = EnvSpec(task_id, obs_space, act_space, None)

    def make_shard(env_ids: list[int]) -> BatchedEnv:
        return GymnasiumBatch([make_one] * len(env_ids))

    if workers == 0:  # the same envs and stepper, in this process
        slots = Slots.allocate(num_envs, obs_space.shape, obs_space.dtype)
        return spec, LocalEngine(Stepper(make_shard(list(range(num_envs))), slots, mode, None,
                                          seeds))
    engine = ProcessEngine(make_shard, num_envs, workers, obs_space, act_space, mode, None, seeds)
    return spec, engine


_BUILTIN_DONE = False


def _register_builtin() -> None:
    """Register the native tasks once, on first use (no import-time side effects)."""
    global _BUILTIN_DONE
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE = True
    from gmi_drl.envs import native_tasks

    native_tasks.register_all(register)
