"""Envs written against the C++ env template (``csrc/env_template.h``): their pool engine and
registry entry.

Source: the EnvPool paper (§3): a C++ env class, a thread pool that steps one env per task and
writes results into preallocated buffers, and ``send``/``recv`` over env ids. A compiled
template module (``GMI_DRL_ENV_MODULE`` in C++, built by setup.py's ``template_env``) holds
``spec(options) -> dict`` and the class ``Pool``; `CppEnvEngine` runs that ``Pool`` under
`gmi_drl.envs.pool.EnvPool`, and `entry` is the registry's ``native`` engine for it
(`gmi_drl.envs.register_cpp` registers one in one call; docs/add-a-cpp-env.md).

Seeding: env ``i``'s first reset gets its pool seed (``seed + i``), every later reset the next
value of that seed's SplitMix64 chain (``gmi_drl::next_seed``); ``reset`` of the pool continues
the chain.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from gmi_drl.envs.engine import Engine, queue_workers
from gmi_drl.envs.factories import EngineEntry, PoolRequest, time_limit
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import AutoresetMode, EnvSpec
from gmi_drl.envs.stepper import Slots

_MODES = {AutoresetMode.NEXT_STEP: 0, AutoresetMode.SAME_STEP: 1, AutoresetMode.DISABLED: 2}


def load(module: str) -> Any:
    """The template module ``module`` names: ``"package.module"`` or ``"package.module:attr"``
    (a submodule of a module that binds several envs).

    Raises:
        ValueError: it does not import, or is no template module (no ``spec`` and ``Pool``).
    """
    name, _, attr = module.partition(":")
    try:
        mod = importlib.import_module(name)
        mod = getattr(mod, attr) if attr else mod
    except (ImportError, AttributeError) as e:
        raise ValueError(f"C++ env module {module!r} cannot be loaded ({e}); build it with "
                         "setup.py's template_env (docs/add-a-cpp-env.md)") from None
    if not (hasattr(mod, "spec") and hasattr(mod, "Pool")):
        raise ValueError(f"{module!r} is not a C++ env template module (no spec and Pool: "
                         "declare it with GMI_DRL_ENV_MODULE)")
    return mod


def spaces(spec: dict[str, Any]) -> tuple[gym.spaces.Space, gym.spaces.Space]:
    """``(observation_space, action_space)`` of a module's ``spec(...)`` dict: a Box of the obs
    dtype (unbounded where the spec gives no bounds: the dtype's range), and ``Discrete(n)`` or
    a float32 Box of the action bounds."""
    dtype = np.dtype(spec["obs_dtype"])
    shape = tuple(spec["obs_shape"])
    if spec["obs_low"]:
        low = np.asarray(spec["obs_low"], np.float64).reshape(shape).astype(dtype)
        high = np.asarray(spec["obs_high"], np.float64).reshape(shape).astype(dtype)
    elif dtype.kind == "f":
        low, high = -np.inf, np.inf
    else:
        info = np.iinfo(dtype)
        low, high = info.min, info.max
    obs_space = gym.spaces.Box(low, high, shape, dtype)
    if spec["num_actions"] > 0:
        return obs_space, gym.spaces.Discrete(int(spec["num_actions"]))
    act_space = gym.spaces.Box(np.asarray(spec["action_low"], np.float32),
                               np.asarray(spec["action_high"], np.float32), dtype=np.float32)
    return obs_space, act_space


class CppEnvEngine(Engine):
    """The pool engine of a template module's ``Pool``: worker threads step the envs without the
    GIL and write the slots in place; see the module docstring.

    Args:
        module: the loaded template module (`load`).
        options: the env's keyword options (numbers; an option the env does not read is refused).
        num_envs: sub-environments. num_threads: worker threads, ``>= 1``.
        mode: the autoreset mode. max_episode_steps: the time limit in steps, or ``None``.
        seeds: ``(num_envs,) int64`` first-reset seeds.

    A failure of an env (an exception in its C++ code, or a write or read outside its spec)
    closes the core, so no worker thread is left running, and is raised as ``RuntimeError``
    naming the env id, the method and the sizes.

    Raises:
        ValueError: an option the env does not take, or an invalid spec.
    """

    concurrent_send = True  # csrc/work_queue.h: push and wait share its mutex

    def __init__(self, module: Any, options: dict[str, float], num_envs: int, num_threads: int,
                 mode: AutoresetMode, max_episode_steps: int | None, seeds: np.ndarray) -> None:
        obs_space, self._action_space = spaces(module.spec(options))
        self.slots = Slots.allocate(num_envs, obs_space.shape, obs_space.dtype)
        s = self.slots
        buffers = dict(obs=s.obs, final_obs=s.final_obs, reward=s.reward,
                       terminated=s.terminated, truncated=s.truncated,
                       episode_return=s.episode_return, episode_length=s.episode_length)
        self._pending = np.asarray(seeds, np.int64).copy()  # first-reset seeds; -1: used
        self._core = module.Pool(num_envs, num_threads, _MODES[AutoresetMode(mode)],
                                 max_episode_steps or 0, self._pending, buffers, options)
        self._discrete = isinstance(self._action_space, gym.spaces.Discrete)

    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        dtype = np.int64 if self._discrete else np.float32
        self._core.send(ids, np.ascontiguousarray(actions, dtype))

    def wait(self, min_count: int = 1) -> np.ndarray:
        return self._failing_closes(self._core.wait, min_count)

    def reset(self, ids: np.ndarray) -> None:
        seeds = self._pending[ids]  # an env's own seed at its first reset, then -1: its chain
        self._pending[ids] = -1
        self._failing_closes(self._core.reset, ids, seeds)

    def pin(self, cores: list[int]) -> None:
        """Pin worker thread ``k`` to CPU ``cores[k % len(cores)]`` (`make`'s
        ``thread_affinity``; the thread that waits in ``recv`` keeps its own).

        Raises:
            RuntimeError: the kernel refused a core.
        """
        self._core.pin(cores)

    def close(self) -> None:
        if self._core is not None:
            self._core.close()
            self._core = None

    def _failing_closes(self, call, *args):
        if self._core is None:
            raise RuntimeError("the C++ env core is closed (an env failed before)")
        try:
            return call(*args)
        except RuntimeError:
            self.close()  # the envs' state is partly stepped: stop every thread now
            raise


def _pool(module_name: str, request: PoolRequest, **task_kwargs: Any) -> EnvPool:
    """The pool of the template module ``module_name``; ``task_kwargs``: the env's options and
    ``max_episode_steps`` (default: the spec's)."""
    module = load(module_name)
    limit = task_kwargs.pop("max_episode_steps", None)
    options = _options(request.task_id, task_kwargs)
    raw = module.spec(options)
    limit = time_limit({"max_episode_steps": limit}, int(raw["max_episode_steps"]) or None)
    obs_space, act_space = spaces(raw)
    spec = EnvSpec(request.task_id, obs_space, act_space, limit)
    engine = CppEnvEngine(module, options, request.num_envs, queue_workers(request.num_threads),
                          request.autoreset, limit, request.seeds)
    return request.pool(spec, engine)


def _options(task_id: str, kwargs: dict[str, Any]) -> dict[str, float]:
    """The env's options ``kwargs`` as floats.

    Raises:
        ValueError: an option that is no real number.
    """
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                              np.floating)):
            raise ValueError(f"{task_id}: option {key}={value!r} must be a number (a C++ env "
                             "takes numeric options)")
        out[key] = float(value)
    return out


def entry(module: str) -> EngineEntry:
    """The ``native`` engine of the template module ``module`` (`load`'s names); unavailable
    where the module does not load."""

    def unavailable(task_kwargs: dict[str, Any]) -> str | None:
        try:
            load(module)
        except ValueError as e:
            return str(e)
        return None

    return EngineEntry(functools.partial(_pool, module), unavailable=unavailable)


EXAMPLE_TASK = "Pendulum-cpp-v1"
"""Pendulum-v1 on the C++ env template (``csrc/examples/pendulum.h``)"""


def engines() -> dict[str, dict[str, EngineEntry]]:
    """The example task's ``native`` engine (the registry's table: task id -> engine name ->
    `EngineEntry`)."""
    return {EXAMPLE_TASK: {"native": entry("gmi_drl.envs._cpp_examples:pendulum")}}
