"""How a task's engine becomes a pool: the one shape every engine registers in.

Each engine of a task is an `EngineEntry`: a factory ``build(request, **task_kwargs)`` that
returns a whole pool (anything with `EnvPool`'s API) from the `PoolRequest` that
`gmi_drl.envs.make` validated, plus why it cannot run here (``unavailable``) and, for engines
that know their spaces without simulating, ``spec``. The registry chooses among a task's engines
by one rule (`ENGINE_ORDER`); it never sees how an engine steps.

The builders here turn the two Python engine kinds into entries:

- `stepped`: a `BatchedEnv` (vectorised NumPy, MuJoCo over ``mujoco.batch``) stepped in the
  caller's process under a `Stepper`, which adds autoreset, the time limit and episode totals
  (the one place they live in Python);
- `gymnasium`: any ``gymnasium.Env`` in worker processes (`ProcessEngine`), each worker running
  the same `Stepper` over its shard, or in the caller's process with ``num_workers=0``.

Engines in native code (the C++ CartPole pool and MuJoCo/Atari cores, MuJoCo Warp) build their
pools themselves and keep their episode bookkeeping in ``csrc/episodes.h`` (C++) and
`gmi_drl.envs.warp.worlds.end_step` (Warp).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from gmi_drl.envs.batched import BatchedEnv, GymnasiumBatch
from gmi_drl.envs.engine import Engine, LocalEngine
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import AutoresetMode, EnvSpec
from gmi_drl.envs.stepper import Slots, Stepper
from gmi_drl.envs.workers import ProcessEngine

ENGINE_ORDER = ("native", "warp", "numpy", "ale", "gymnasium")
"""Every engine name, fastest first: ``engine="auto"`` takes the first one a task has that can
run here. ``native``: C++ cores (CartPole-v1, MuJoCo v5 locomotion, Atari); ``warp``: MuJoCo
Warp (the ``*-gmi-v0`` tasks, on a GPU or Warp's CPU device); ``numpy``: vectorised NumPy in the
caller's process; ``ale``: ale-py's vector envs (Atari); ``gymnasium``: the Gymnasium env
itself, one per sub-environment, in worker processes (any Gymnasium id)."""


@dataclass(frozen=True)
class PoolRequest:
    """What `gmi_drl.envs.make` validated, handed to the chosen engine's factory.

    Attributes:
        task_id: the task's registered name.
        num_envs: sub-environments, ``>= 1``.
        env_batch_size: envs per `EnvPool.recv`, in ``[1, num_envs]``.
        num_workers: worker threads or processes, in ``[0, num_envs]`` (``0``: step in the
            caller's process, for engines that have workers at all).
        seeds: ``(num_envs,) int64``, each env's first-reset seed (`gmi_drl.envs.spec.env_seeds`).
        autoreset: the `AutoresetMode`.
        device: where a device engine simulates (``"cpu"``, ``"cuda:0"``); CPU engines ignore it.
        thread_affinity: CPU cores for the engine's worker threads, thread ``k`` on
            ``thread_affinity[k % len]`` (EnvPool's ``thread_affinity_offset``); ``()``: unpinned.
    """

    task_id: str
    num_envs: int
    env_batch_size: int
    num_workers: int
    seeds: np.ndarray
    autoreset: AutoresetMode
    device: str = "cpu"
    thread_affinity: tuple[int, ...] = ()

    @property
    def num_threads(self) -> int:
        """Threads for an in-process engine: ``num_workers``, at least 1."""
        return max(self.num_workers, 1)

    def pool(self, spec: EnvSpec, engine: Engine) -> EnvPool:
        """The Python `EnvPool` front end over ``engine``, sized as requested, its worker
        threads pinned where ``thread_affinity`` asks.

        Raises:
            ValueError: ``thread_affinity`` for an engine without worker threads to pin (the
                engine is closed first).
        """
        if self.thread_affinity:
            pin = getattr(engine, "pin", None)
            if pin is None:
                engine.close()
                raise ValueError(f"thread_affinity={list(self.thread_affinity)}: this engine of "
                                 f"{self.task_id} has no worker threads to pin (the native "
                                 "MuJoCo and Atari cores have)")
            try:
                pin(list(self.thread_affinity))
            except RuntimeError as e:
                engine.close()
                raise ValueError(f"thread_affinity={list(self.thread_affinity)}: {e}") from None
        return EnvPool(spec, engine, self.num_envs, self.env_batch_size, self.autoreset)


PoolFactory = Callable[..., Any]
"""``build(request: PoolRequest, **task_kwargs)`` -> a pool with `EnvPool`'s API."""


def _available(task_kwargs: dict[str, Any]) -> str | None:
    return None


@dataclass(frozen=True)
class EngineEntry:
    """One engine of one task.

    Attributes:
        build: ``build(request, **task_kwargs)`` -> the pool. Raises ``ValueError`` for task
            keywords or request sizes it cannot honour, saying which.
        unavailable: ``unavailable(task_kwargs) -> str | None``: why this engine cannot run here
            with these keywords (a native core not built, an optional dependency missing, an
            option of another engine), or ``None``.
        spec: ``spec()`` -> the task's `EnvSpec` without building anything, where the engine
            knows it (``None``: `gmi_drl.envs.task_spec` builds a one-env pool instead).
        autoreset_modes: the `AutoresetMode`s it runs, the default first (``make`` without an
            ``autoreset`` takes it).
    """

    build: PoolFactory
    unavailable: Callable[[dict[str, Any]], str | None] = _available
    spec: Callable[[], EnvSpec] | None = None
    autoreset_modes: tuple[AutoresetMode, ...] = tuple(AutoresetMode)


def time_limit(task_kwargs: dict[str, Any], default: int | None) -> int | None:
    """Pop Gymnasium's ``max_episode_steps`` keyword from ``task_kwargs``: the time limit in
    steps (``default``, the task's own, when absent or ``None``).

    Raises:
        ValueError: a limit that is no int >= 1.
    """
    limit = task_kwargs.pop("max_episode_steps", None)
    if limit is None:  # (as gymnasium.make: None is the task's own)
        return default
    if not isinstance(limit, (int, np.integer)) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"max_episode_steps={limit!r} must be an int >= 1")
    return int(limit)


def build_with_keywords(task_id: str, make: Callable[..., Any], **kwargs: Any) -> Any:
    """``make(**kwargs)``, where a keyword ``make`` does not take is a ValueError naming the
    ones it does (not a TypeError from deep inside)."""
    import inspect

    params = inspect.signature(make).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        known = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        unknown = sorted(set(kwargs) - set(known))
        if unknown:
            options = sorted(set(known) - {"self", "num_envs", "num_threads"})
            raise ValueError(f"{task_id} does not take the keyword(s) {unknown}; it takes "
                             f"{options + ['max_episode_steps']}")
    return make(**kwargs)


def stepped_pool(request: PoolRequest, env: BatchedEnv,
                 max_episode_steps: int | None) -> EnvPool:
    """A pool stepping ``env`` (``request.num_envs`` envs) in the caller's process under a
    `Stepper` (autoreset, the time limit ``max_episode_steps`` in steps, episode totals)."""
    spec = EnvSpec(request.task_id, env.observation_space, env.action_space, max_episode_steps)
    space = env.observation_space
    slots = Slots.allocate(request.num_envs, space.shape, space.dtype)
    stepper = Stepper(env, slots, request.autoreset, max_episode_steps, request.seeds)
    return request.pool(spec, LocalEngine(stepper))


def stepped(make_env: Callable[..., BatchedEnv], max_episode_steps: int | None,
            **entry: Any) -> EngineEntry:
    """The entry of a `BatchedEnv` task: ``make_env(num_envs=, num_threads=, **task_kwargs)``
    builds it, `stepped_pool` runs it, ``max_episode_steps`` steps long unless the keyword of
    that name sets another limit (`time_limit`). ``entry``: `EngineEntry`'s other fields."""

    def build(request: PoolRequest, **task_kwargs: Any) -> EnvPool:
        limit = time_limit(task_kwargs, max_episode_steps)
        env = build_with_keywords(request.task_id, make_env, num_envs=request.num_envs,
                                  num_threads=request.num_threads, **task_kwargs)
        return stepped_pool(request, env, limit)

    return EngineEntry(build, **entry)


_ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                 gym.spaces.MultiBinary)
"""observation spaces a batch holds in one array (Dict, Tuple and the rest do not)"""

_ACTION_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete)
"""action spaces a pool takes (`gmi_drl.envs.pool.EnvPool` checks actions against them)"""


def gymnasium(env_fn: str | Callable[..., gym.Env]) -> EngineEntry:
    """The entry of the generic path: ``env_fn`` is a Gymnasium id (``gymnasium.make(id,
    **task_kwargs)``) or a callable ``env_fn(**task_kwargs) -> gymnasium.Env``; one env per
    sub-environment, stepped in ``num_workers`` processes (``0``: in the caller's process),
    the env's own time limit."""

    def build(request: PoolRequest, **task_kwargs: Any) -> EnvPool:
        if isinstance(env_fn, str):
            def make_one() -> gym.Env:
                return gym.make(env_fn, **task_kwargs)
        else:
            def make_one() -> gym.Env:
                return env_fn(**task_kwargs)

        probe = make_one()
        try:
            obs_space, act_space = probe.observation_space, probe.action_space
        finally:
            probe.close()
        if not isinstance(obs_space, _ARRAY_SPACES):
            raise ValueError(
                f"{request.task_id}: observation space {obs_space} is not an array space "
                f"({', '.join(c.__name__ for c in _ARRAY_SPACES)}): a pool holds each batch "
                "of observations in one array; register a factory that wraps the env in "
                "gymnasium.wrappers.FlattenObservation")
        if not isinstance(act_space, _ACTION_SPACES):
            raise ValueError(
                f"{request.task_id}: unsupported action space {act_space}: a pool takes "
                f"{', '.join(c.__name__ for c in _ACTION_SPACES)} actions; register a factory "
                "that wraps the env to take one of them")

        def make_shard(env_ids: list[int]) -> BatchedEnv:
            return GymnasiumBatch([make_one] * len(env_ids))

        if request.num_workers == 0:  # the same envs and stepper, in this process
            return stepped_pool(request, make_shard(list(range(request.num_envs))), None)
        spec = EnvSpec(request.task_id, obs_space, act_space, None)
        engine = ProcessEngine(make_shard, request.num_envs, request.num_workers, obs_space,
                               act_space, request.autoreset, None, request.seeds)
        return request.pool(spec, engine)

    return EngineEntry(build)
