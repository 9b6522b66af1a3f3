"""MuJoCo locomotion on a C++ thread pool: EnvPool's thread-pool engine for Gymnasium's v5 tasks.

Source: the EnvPool paper (§3): actions are queued with their env ids and
``send`` returns at once; worker threads step one env each, write its results into the pool's
state buffers, and ``recv`` returns the first ``env_batch_size`` envs to finish. With
``num_envs > env_batch_size`` the physics of the next batch runs while the caller works on this
one.

`MujocoThreadEngine` wraps the native core ``gmi_drl.envs._mujoco_core`` (``csrc/
mujoco_core.cpp``, built by ``pip install``, linked against the ``mujoco`` wheel's library).
Per step and env it runs, without the GIL: control from the action, ``frame_skip`` ``mj_step``
calls, observation, reward, termination, the pool's time limit, episode statistics and
autoreset. Python keeps only what must stay Python for exactness: each env's
``np.random.Generator`` (Gymnasium's ``seeding.np_random``), from which it pre-draws the next
reset state of every env the core returned (``next_qpos``/``next_qvel``); so the trajectories equal
Gymnasium's and the NumPy engine's (``tests/envs/test_mujoco_threads.py``).

Tasks: Hopper-v5, Walker2d-v5, HalfCheetah-v5, Swimmer-v5 (observations and rewards read only
``qpos``/``qvel``), and Ant-v5 and Humanoid-v5, for which the core runs Gymnasium's
``mj_forward`` at reset and ``mj_rnePostConstraint`` after each step (contact forces, ``cinert``,
``cvel``, ``qfrc_actuator``) and sums squares in NumPy's pairwise order. This is these tasks'
``native`` engine; ``engine="numpy"`` selects the vectorised NumPy one
(`gmi_drl.envs.mujoco_locomotion`), which ``"auto"`` also takes where the core cannot run.
"""

from __future__ import annotations

import functools
from typing import Any

import mujoco
import numpy as np

from gmi_drl.envs import mujoco_locomotion as ml
from gmi_drl.envs.engine import Engine, queue_workers
from gmi_drl.envs.factories import EngineEntry, PoolRequest, build_with_keywords, time_limit
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import AutoresetMode, EnvGenerators, EnvSpec
from gmi_drl.envs.stepper import Slots

try:
    from gmi_drl.envs import _mujoco_core
except ImportError as e:  # not built (no compiler at install time): the NumPy engine runs
    _mujoco_core = None
    _IMPORT_ERROR = f"the native core gmi_drl.envs._mujoco_core is not built ({e})"
else:
    _IMPORT_ERROR = None

TASKS = {task_id: ml.TASKS[task_id] for task_id in
         ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Swimmer-v5", "Ant-v5", "Humanoid-v5")}
_MODES = {AutoresetMode.NEXT_STEP: 0, AutoresetMode.SAME_STEP: 1, AutoresetMode.DISABLED: 2}


def unavailable_reason(env: ml.MujocoBatch | None = None) -> str | None:
    """Why the thread engine cannot run (``env``: a task instance to check), or ``None``."""
    if _mujoco_core is None:
        return _IMPORT_ERROR
    if _mujoco_core.MUJOCO_VERSION != mujoco.mj_version():
        return (f"the native core was built against MuJoCo {_mujoco_core.MUJOCO_VERSION} but "
                f"MuJoCo {mujoco.mj_version()} is installed; reinstall gmi-drl to rebuild it")
    if env is not None:
        if type(env) not in {cls for cls, _ in TASKS.values()}:
            return f"{type(env).__name__} is not a thread-engine task"
    return None


def _task(env: ml.MujocoBatch) -> Any:
    """The core's `Task` parameters of a task instance (its Gymnasium keyword arguments)."""
    t = _mujoco_core.Task()
    t.frame_skip, t.dt, t.obs_skip = env.frame_skip, env.dt, env._skip
    t.forward_w, t.ctrl_w = float(env._forward_w), float(env._ctrl_w)
    if isinstance(env, (ml.AntBatch, ml.HumanoidBatch)):
        t.contact_w, t.healthy_reward = float(env._contact_w), float(env._healthy_reward)
        t.terminate = bool(env._terminate)
        t.min_z, t.max_z = env._z_range
    if isinstance(env, ml.AntBatch):
        t.kind, t.main_body = _mujoco_core.KIND_ANT, int(env._main_body)
        t.force_low, t.force_high = env._force_range
        t.obs_cfrc = bool(env._include_cfrc)
    elif isinstance(env, ml.HumanoidBatch):
        t.kind, t.mass_total = _mujoco_core.KIND_HUMANOID, float(env._mass_total)
        t.cost_low, t.cost_high = env._contact_range
        parts = {field for field, _ in env._parts}
        t.obs_cinert, t.obs_cvel = "cinert" in parts, "cvel" in parts
        t.obs_qfrc, t.obs_cfrc = "qfrc_actuator" in parts, "cfrc_ext" in parts
    if isinstance(env, ml._PlanarWalker):
        t.vel_clip = 10.0
        t.healthy_terms, t.healthy_reward = True, float(env._healthy_reward)
        t.terminate = bool(env._terminate)
        (t.min_z, t.max_z), (t.min_angle, t.max_angle) = env._z_range, env._angle_range
        if isinstance(env, ml.HopperBatch):
            t.state_range = True
            t.min_state, t.max_state = env._state_range
    return t


class MujocoThreadEngine(Engine):
    """The pool engine of the C++ thread core; see the module docstring.

    Args:
        env: a one-env instance of the task (its model, spaces, parameters and reset noise).
        num_envs: sub-environments.
        num_threads: C++ worker threads, ``>= 1``.
        mode: the autoreset mode.
        max_episode_steps: the time limit in steps, or ``None``.
        seeds: ``(num_envs,)`` seed of each env's first reset.

    Raises:
        ValueError: the core cannot run this task (the reason from `unavailable_reason`).
    """

    concurrent_send = True  # csrc/work_queue.h: push and wait share its mutex

    def __init__(self, env: ml.MujocoBatch, num_envs: int, num_threads: int,
                 mode: AutoresetMode, max_episode_steps: int | None, seeds: np.ndarray) -> None:
        reason = unavailable_reason(env)
        if reason is not None:
            raise ValueError(f"engine='native' cannot run: {reason}")
        self._env = env
        model = env.model
        self.slots = Slots.allocate(num_envs, env.observation_space.shape, np.float64)
        self._next_qpos = np.zeros((num_envs, model.nq))
        self._next_qvel = np.zeros((num_envs, model.nv))
        self._has_next = np.zeros(num_envs, bool)
        self._pending_seeds: list[int | None] = [int(s) for s in seeds]
        self._rngs = EnvGenerators(num_envs)
        s = self.slots
        buffers = dict(obs=s.obs, final_obs=s.final_obs, reward=s.reward,
                       terminated=s.terminated, truncated=s.truncated,
                       episode_return=s.episode_return, episode_length=s.episode_length,
                       next_qpos=self._next_qpos, next_qvel=self._next_qvel,
                       has_next=self._has_next)
        self._core = _mujoco_core.MujocoCore(model, num_envs, num_threads, _task(env),
                                             _MODES[AutoresetMode(mode)],
                                             max_episode_steps or 0, buffers)

    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        if actions.dtype != np.float32 and actions.dtype != np.float64:
            actions = actions.astype(np.float64)
        self._core.send(ids, actions)

    def wait(self, min_count: int = 1) -> np.ndarray:
        done = self._core.wait(min_count)
        has_next = self._has_next
        if not has_next[done].all():
            self._draw(done[~has_next[done]])
        return done

    def reset(self, ids: np.ndarray) -> None:
        fresh = [i for i in ids.tolist() if self._pending_seeds[i] is not None]
        stale = ids[~self._has_next[ids]]
        self._draw(np.union1d(np.asarray(fresh, np.int64), stale))
        self._core.reset(ids)
        self._draw(ids)

    def pin(self, cores: list[int]) -> None:
        """Pin the core's worker thread ``k`` to CPU ``cores[k % len(cores)]`` (the thread
        that waits in `recv` is the caller's and keeps its own).

        Raises:
            RuntimeError: the kernel refused a core (not in this process's CPU set).
        """
        self._core.pin(cores)

    def close(self) -> None:
        if self._core is not None:
            self._core.close()
            self._core = None

    def _draw(self, ids: np.ndarray) -> None:
        """Draw each env's next reset state from its generator (Gymnasium's reset order)."""
        for i in ids.tolist():
            rng = self._rngs(i, self._pending_seeds[i])
            self._pending_seeds[i] = None
            self._next_qpos[i], self._next_qvel[i] = self._env._reset_state(rng)
            self._has_next[i] = True


def _native_pool(task_id: str, request: PoolRequest, **kwargs: Any) -> EnvPool:
    """The ``native`` engine's pool of ``task_id`` (``kwargs``: its Gymnasium keywords)."""
    cls, max_episode_steps = TASKS[task_id]
    max_episode_steps = time_limit(kwargs, max_episode_steps)
    probe = build_with_keywords(task_id, cls, num_envs=1, num_threads=1, **kwargs)
    spec = EnvSpec(task_id, probe.observation_space, probe.action_space, max_episode_steps)
    engine = MujocoThreadEngine(probe, request.num_envs, queue_workers(request.num_threads),
                                request.autoreset, max_episode_steps, request.seeds)
    return request.pool(spec, engine)


def engines() -> dict[str, dict[str, EngineEntry]]:
    """The ``native`` engine of each of the `TASKS` (the registry's table: task id -> engine
    name -> `EngineEntry`); their ``numpy`` engine is `gmi_drl.envs.mujoco_locomotion`'s."""
    return {task_id: {"native": EngineEntry(functools.partial(_native_pool, task_id),
                                            unavailable=lambda kwargs: unavailable_reason())}
            for task_id in TASKS}
