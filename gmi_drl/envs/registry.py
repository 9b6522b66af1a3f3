"""Task registry and `make`: one registration shape, one engine selector.

Every task registers its engines by name (`gmi_drl.envs.factories.EngineEntry`); `make` picks
one (``engine=``, or the first of `ENGINE_ORDER` that can run here), validates the request once
and hands it to that engine's factory. Any Gymnasium id also has the ``gymnasium`` engine (its
own env in worker processes), so an unregistered id works too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gymnasium as gym
import numpy as np

from gmi_drl.envs import factories
from gmi_drl.envs.engine import queue_workers
from gmi_drl.envs.factories import ENGINE_ORDER, EngineEntry, PoolRequest
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import AutoresetMode, EnvSpec, env_seeds


@dataclass(frozen=True)
class TaskEntry:
    """How to build one task: its engines by name, and default keywords for their factories."""

    task_id: str
    engines: dict[str, EngineEntry]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def order(self) -> list[str]:
        """The engine names in the order ``"auto"`` tries them: `ENGINE_ORDER`, then new names."""
        names = [n for n in ENGINE_ORDER if n in self.engines]
        return names + [n for n in self.engines if n not in names]

    def select(self, engine: str, task_kwargs: dict[str, Any]) -> tuple[str, EngineEntry]:
        """The engine ``engine`` names (``"auto"``: the first of `ENGINE_ORDER` available here).

        Raises:
            ValueError: an engine this task does not have, one that cannot run here, or (auto)
                none that can; the message names the engines and why each cannot run.
        """
        names = self.order()
        if engine != "auto":
            if engine not in self.engines:
                raise ValueError(f"engine={engine!r} must be one of {['auto', *names]} for "
                                 f"{self.task_id}")
            reason = self.engines[engine].unavailable(task_kwargs)
            if reason is not None:
                raise ValueError(f"engine={engine!r} cannot run {self.task_id}: {reason}")
            return engine, self.engines[engine]
        reasons, passed = [], []
        for name in names:
            reason = self.engines[name].unavailable(task_kwargs)
            if reason is None:
                if passed:  # an engine passed over for the keywords given: say so
                    log.info("%s on the %s engine: %s", self.task_id, name, "; ".join(passed))
                return name, self.engines[name]
            reasons.append(f"{name}: {reason}")
            if task_kwargs and self.engines[name].unavailable({}) is None:
                passed.append(f"{name} cannot take these keywords ({reason})")
        raise ValueError(f"no engine of {self.task_id} can run here ({'; '.join(reasons)})")


log = logging.getLogger(__name__)

_REGISTRY: dict[str, TaskEntry] = {}


def register(task_id: str, env_fn: str | Callable[..., gym.Env] | None = None, *,
             engines: Mapping[str, EngineEntry] | None = None, **kwargs: Any) -> None:
    """Register ``task_id``; `make` then builds pools of it.

    Args:
        task_id: the name to make it by.
        env_fn: a Gymnasium id, or a callable returning a ``gymnasium.Env``: the task runs on the
            ``gymnasium`` engine (one env per sub-environment, in worker processes). Shorthand
            for ``engines={"gymnasium": factories.gymnasium(env_fn)}``.
        engines: the task's engines by name (`factories.EngineEntry`; names from
            `ENGINE_ORDER`, or new ones, which ``"auto"`` tries last).
        **kwargs: default keyword arguments for the engines' factories.

    A run's GMI processes (the local placement's, Ray actors) get the registration with the
    run (`registration`, `adopt`), so a task registered in the script that calls
    ``gmi_drl.train.train`` trains on every placement.

    Raises:
        ValueError: neither or both of ``env_fn`` and ``engines``, no engine, an ``env_fn``
            that is neither a Gymnasium id nor callable, or an engine that is no
            `factories.EngineEntry`.
    """
    _add(task_id, env_fn, engines=engines, **kwargs)
    _USER_TASKS.add(task_id)


def register_cpp(task_id: str, module: str, **kwargs: Any) -> None:
    """Register the env of a C++ env template module (``csrc/env_template.h``) as ``task_id``:
    `make`, `gmi_drl.envs.make_vec`, ``make_dm`` and the SB3 face then run it on its C++
    worker threads (its ``native`` engine; docs/add-a-cpp-env.md).

    Args:
        task_id: the name to make it by.
        module: the compiled module's import name, ``"package._my_env"``, or
            ``"package._envs:my_env"`` for a submodule of a module that binds several envs.
        **kwargs: default options of the env (numbers; `make`'s keywords override them) and
            ``max_episode_steps`` (default: the spec's).

    Raises:
        ValueError: the module does not import or is no template module.
    """
    from gmi_drl.envs import cpp_env

    cpp_env.load(module)
    register(task_id, engines={"native": cpp_env.entry(module)}, **kwargs)


def _add(task_id: str, env_fn: str | Callable[..., gym.Env] | None = None, *,
         engines: Mapping[str, EngineEntry] | None = None, **kwargs: Any) -> None:
    """`register` without counting ``task_id`` as the user's (the built-in tasks)."""
    if (env_fn is None) == (engines is None) or engines == {}:
        raise ValueError(f"register({task_id!r}): give exactly one of env_fn and a non-empty "
                         "engines mapping")
    if env_fn is not None and not (isinstance(env_fn, str) or callable(env_fn)):
        raise ValueError(f"register({task_id!r}): env_fn={env_fn!r} must be a Gymnasium id or "
                         "a callable that returns a gymnasium.Env")
    bad = [name for name, e in (engines or {}).items() if not isinstance(e, EngineEntry)]
    if bad:
        raise ValueError(f"register({task_id!r}): engines {bad} must be "
                         "gmi_drl.envs.factories.EngineEntry values (factories.py has builders)")
    table = dict(engines) if engines is not None else {"gymnasium": factories.gymnasium(env_fn)}
    _REGISTRY[task_id] = TaskEntry(task_id, table, kwargs)


_USER_TASKS: set[str] = set()
"""task ids registered through `register` (not built in)"""


def registration(task_id: str) -> bytes | None:
    """``task_id``'s registration in this process, pickled with cloudpickle (closures and
    functions of ``__main__`` by value) for `adopt` in another; ``None`` for a built-in task or
    a Gymnasium id, which every process knows.

    Raises:
        ValueError: the registration does not pickle (its factory holds a lock, a socket, ...).
    """
    import cloudpickle

    if task_id not in _USER_TASKS:
        return None
    try:
        return cloudpickle.dumps(_REGISTRY[task_id])
    except Exception as e:  # noqa: BLE001 - whatever pickling raises
        raise ValueError(f"the registration of {task_id!r} cannot be sent to the GMI processes "
                         f"({type(e).__name__}: {e}): register it at the import of a module "
                         "they import too, or with a factory that pickles") from None


def adopt(blob: bytes | None) -> None:
    """Register what `registration` gave in another process (``None``: nothing)."""
    import cloudpickle

    if blob is not None:
        entry = cloudpickle.loads(blob)
        _REGISTRY[entry.task_id] = entry
        _USER_TASKS.add(entry.task_id)


def _entry(task_id: str) -> TaskEntry | None:
    _register_builtin()
    entry = _REGISTRY.get(task_id)
    if entry is not None and "gymnasium" not in entry.engines and task_id in gym.registry:
        entry = TaskEntry(task_id, {**entry.engines, "gymnasium": factories.gymnasium(task_id)},
                          entry.kwargs)
    elif entry is None and task_id in gym.registry:
        entry = TaskEntry(task_id, {"gymnasium": factories.gymnasium(task_id)})
    return entry


def _problem(task_id: str, entry: TaskEntry | None) -> str | None:
    """Why ``task_id`` cannot be made here: unknown, or a MuJoCo task where MuJoCo cannot be
    imported (`builtin_tasks.mujoco_unavailable`); None where it can."""
    from gmi_drl.envs.builtin_tasks import mujoco_unavailable

    no_mujoco = mujoco_unavailable()
    if entry is None:
        return (f"unknown task_id={task_id!r}"
                + (f" (the MuJoCo tasks are unavailable: {no_mujoco})" if no_mujoco else ""))
    spec = gym.registry.get(task_id)
    if no_mujoco and spec is not None and "mujoco" in str(spec.entry_point):
        return f"task_id={task_id!r} needs MuJoCo: {no_mujoco}"
    return None


def _known(task_id: str) -> TaskEntry:
    entry = _entry(task_id)
    problem = _problem(task_id, entry)
    if problem is not None:
        raise ValueError(problem)
    return entry


def engines(task_id: str) -> list[str]:
    """The engines ``task_id`` has, in the order ``engine="auto"`` tries them.

    Raises:
        ValueError: unknown ``task_id``, or a MuJoCo task where MuJoCo does not import.
    """
    return _known(task_id).order()


def task_spec(task_id: str, engine: str = "auto", **task_kwargs: Any) -> EnvSpec:
    """The `EnvSpec` of ``task_id`` (its spaces) on ``engine``, without simulating where the
    engine knows it (the warp tasks read it from their definition); otherwise from a one-env pool
    made in this process.

    Raises:
        ValueError: unknown ``task_id``, a MuJoCo task where MuJoCo does not import, or as
            `make`.
    """
    entry = _known(task_id)
    kwargs = {**entry.kwargs, **task_kwargs}
    _, chosen = entry.select(engine, kwargs)
    if chosen.spec is not None:
        return chosen.spec()
    with make(task_id, 1, num_workers=0, engine=engine, **task_kwargs) as pool:
        return pool.spec


def list_tasks() -> list[str]:
    """Task ids registered with gmi-drl (any other Gymnasium id also works, generically)."""
    _register_builtin()
    return sorted(_REGISTRY)


CPU_BUDGET_VAR = "GMI_NUM_CPUS"
"""set by a launcher whose GMI processes are not pinned (a Ray actor's affinity is its whole
node): the CPUs the GMI reserved"""


def cpu_budget() -> int:
    """The CPUs this process may use for env workers: `CPU_BUDGET_VAR` where a launcher set it,
    else the cores of its affinity."""
    given = os.environ.get(CPU_BUDGET_VAR, "")
    return int(given) if given.isdigit() and int(given) >= 1 else len(os.sched_getaffinity(0))


def make(task_id: str, num_envs: int, env_batch_size: int | None = None,
         num_workers: int | None = None, seed: int | Sequence[int] = 0,
         autoreset: str | AutoresetMode | None = None, device: str | None = None,
         engine: str = "auto", thread_affinity: int | Sequence[int] | None = None,
         **task_kwargs: Any) -> EnvPool:
    """Build an `EnvPool` of ``num_envs`` sub-environments of ``task_id`` (the warp engine: a
    `gmi_drl.envs.warp.pool.WarpPool`, the same API with full batches, ``same_step``
    autoreset only, and torch tensors on its device).

    Args:
        task_id: a registered task (`list_tasks`) or any Gymnasium id.
        num_envs: sub-environments in the pool.
        env_batch_size: envs returned per `EnvPool.recv`; ``None`` means ``num_envs``
            (synchronous). Must be in ``[1, num_envs]``.
        num_workers: threads (native engines) or processes (``gymnasium`` engine); ``None``: the
            CPUs this process may use (`cpu_budget`), at most ``num_envs``; ``0`` steps the
            ``gymnasium`` engine in this process (no worker processes: what the serial
            placement uses).
        seed: env ``i`` is first reset with seed ``seed + i`` (as ``gymnasium.Env.reset(seed=)``),
            or with ``seed[i]`` for a sequence of ``num_envs`` ints (`env_seeds`); later resets
            continue that env's generator. Env seeds outside [0, 2**63) are refused here, and
            ALE and the warp engine refuse those outside [0, 2**31).
        autoreset: ``"next_step"``, ``"same_step"`` or ``"disabled"`` (see `AutoresetMode`);
            ``None``: the engine's default, ``"next_step"`` (EnvPool's and Gymnasium's) where it
            runs every mode, else the one it runs (the warp engine: ``"same_step"``).
        device: where a device engine simulates and returns its tensors (``"cuda:0"``; the warp
            engine, ``None``: ``"cpu"``); the CPU engines ignore it and return NumPy.
        engine: which of the task's engines runs it (`engines(task_id)` lists them; names in
            `factories.ENGINE_ORDER`): ``"auto"`` takes the first that can run here.
        thread_affinity: pin the engine's worker threads (the native MuJoCo and Atari cores):
            an int ``k`` pins thread ``i`` to core ``k + i`` (EnvPool's
            ``thread_affinity_offset``), a sequence of cores pins thread ``i`` to
            ``cores[i % len(cores)]``; ``None``: the threads run where the OS puts them. A
            pool of ``num_workers`` threads has ``num_workers - 1`` worker threads (at least
            one): the caller's thread, which steps envs in ``recv``, keeps its own affinity.
        **task_kwargs: passed to the engine's factory (the task's options, e.g. ``frame_skip``);
            ``max_episode_steps`` sets the time limit in steps, as in ``gymnasium.make``.

    Raises:
        ValueError: unknown ``task_id``, an invalid size or mode, or a ``thread_affinity`` naming
            a core this process may not run on (all named at once), an engine
            the task does not have or that cannot run here (with the reason), a keyword a
            gmi-drl engine does not take, an action space other than Box, Discrete or
            MultiDiscrete, or observations that are no array.
        TypeError: a keyword the env of a task on the ``gymnasium`` engine does not take
            (``gymnasium.make``'s own error).
    """
    errors = []
    if not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or num_envs < 1:
        errors.append(f"num_envs={num_envs!r} must be an int >= 1")
        num_envs = 1
    batch = num_envs if env_batch_size is None else env_batch_size
    if not isinstance(batch, (int, np.integer)) or not 1 <= batch <= num_envs:
        errors.append(f"env_batch_size={env_batch_size!r} must be in [1, num_envs={num_envs}]")
    workers = min(num_envs, cpu_budget()) if num_workers is None else num_workers
    if not isinstance(workers, (int, np.integer)) or not 0 <= workers <= num_envs:
        errors.append(f"num_workers={num_workers!r} must be in [0, num_envs={num_envs}]")
    try:
        mode = None if autoreset is None else AutoresetMode(autoreset)
    except ValueError:
        errors.append(f"autoreset={autoreset!r} must be one of "
                      f"{[m.value for m in AutoresetMode]} or None")
    entry = _entry(task_id)
    if entry is None:
        errors.append(f"task_id={task_id!r} is neither registered (gmi_drl.envs.list_tasks()) "
                      "nor a Gymnasium id")
    elif (problem := _problem(task_id, entry)) is not None:
        errors.append(problem)
    try:
        seeds = env_seeds(seed, num_envs)
    except ValueError as e:
        errors.append(str(e))
    cores = _thread_cores(thread_affinity, workers, errors)
    if errors:
        raise ValueError("invalid pool: " + "; ".join(errors))
    kwargs = {**entry.kwargs, **task_kwargs}
    _, chosen = entry.select(engine, kwargs)
    if mode is None:
        mode = chosen.autoreset_modes[0]
    request = PoolRequest(task_id, int(num_envs), int(batch), int(workers), seeds, mode,
                          device or "cpu", cores)
    return chosen.build(request, **kwargs)


def _thread_cores(affinity: int | Sequence[int] | None, workers: Any,
                  errors: list[str]) -> tuple[int, ...]:
    """The cores of `make`'s ``thread_affinity`` (``()``: unpinned); a problem goes to
    ``errors``."""
    if affinity is None:
        return ()
    allowed = sorted(os.sched_getaffinity(0))
    if isinstance(affinity, (int, np.integer)) and not isinstance(affinity, bool):
        # the threads pinned: the queue's workers (the caller, one of the pool's threads, keeps
        # its own core)
        n = queue_workers(max(int(workers), 1)) if isinstance(workers, (int, np.integer)) else 1
        cores = tuple(int(affinity) + i for i in range(n))
    elif isinstance(affinity, (list, tuple)) and affinity and all(
            isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in affinity):
        cores = tuple(int(c) for c in affinity)
    else:
        errors.append(f"thread_affinity={affinity!r} must be an int (the first core) or a "
                      "non-empty list of cores")
        return ()
    missing = sorted(set(cores) - set(allowed))
    if missing:
        errors.append(f"thread_affinity={affinity!r} names core(s) {missing} this process cannot "
                      f"run on (its cores: {allowed})")
    return cores


_BUILTIN_DONE = False


def _register_builtin() -> None:
    """Register the native tasks once, on first use (no import-time side effects)."""
    global _BUILTIN_DONE
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE = True
    from gmi_drl.envs import builtin_tasks

    builtin_tasks.register_all(_add)
