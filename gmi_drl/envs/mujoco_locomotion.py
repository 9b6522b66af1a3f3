"""Native batched MuJoCo locomotion tasks: Gymnasium's v5 Hopper, HalfCheetah, Walker2d, Ant,
Humanoid, Swimmer and InvertedPendulum, on MuJoCo's own thread pool.

Source: ``gymnasium/envs/mujoco/{hopper,half_cheetah,walker2d,ant,humanoid,swimmer,
inverted_pendulum}_v5.py`` and ``mujoco_env.py`` (Gymnasium 1.x). Each task loads the same XML
asset with the same frame skip and evaluates the same reset noise, observation, reward and
termination formulas, as NumPy over all envs of a call, in the same floating-point order
(sums of squares over the same rows, the same einsum, the same dtypes: a float32 action gives a
float32 control cost, as in Gymnasium). The physics runs in `mujoco.batch.Batch` (MuJoCo >= 4.0):
``num_envs`` simulations of one model stepped on ``num_threads`` C++ threads, bit-identical to
``mujoco.mj_step`` on one ``MjData`` per env. Trajectories therefore equal Gymnasium's exactly
(``tests/envs/test_mujoco_locomotion.py`` checks this in lockstep).

Derived quantities follow ``MujocoEnv.do_simulation`` (``mj_step(nstep=frame_skip)``, then
``mj_rnePostConstraint``): positions such as ``xpos`` are those MuJoCo leaves after ``mj_step``
(every one of these XMLs integrates with RK4, whose last stage leaves an intermediate state's
kinematics in ``MjData``), and ``cfrc_ext`` (Ant, Humanoid) is computed from that state's contacts.
Contacts live in ``MjData``'s arena, which a batch cannot bind, so Ant and Humanoid run a
persistent batch (one ``MjData`` per env) and, per stepped env, copy its ``MjData`` into a scratch
one (`Batch.get_data`) and run ``mj_rnePostConstraint`` there: a per-env loop, small beside the
physics. The other five tasks read only state fields and stay fully vectorised.

Not supported: rendering, ``info`` dicts, Gymnasium's ``default_camera_config``/render keywords.
"""

from __future__ import annotations

import os
import warnings
from typing import Sequence

import gymnasium
import mujoco
import numpy as np
from gymnasium import spaces
from mujoco.batch import Batch

from gmi_drl.envs.batched import BatchedEnv, StepResult
from gmi_drl.envs.factories import EngineEntry, stepped
from gmi_drl.envs.spec import EnvGenerators

_ASSET_DIR = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")


class MujocoModelWarning(UserWarning):
    """A warning of MuJoCo's compiler while it loaded a task's model (MuJoCo 4.0 deprecates
    ``settotalmass``, which Gymnasium's own ``half_cheetah.xml`` uses)."""


def load_model(path: str) -> mujoco.MjModel:
    """``mujoco.MjModel.from_xml_path(path)``, its compiler's warnings given as
    `MujocoModelWarning` (shown once per process by Python's default filter; filterable)
    instead of MuJoCo's default: printed on every load and appended to ``MUJOCO_LOG.TXT`` in the
    current directory. The warning handler is MuJoCo's global one, replaced for the load only.

    Raises:
        ValueError: MuJoCo could not compile the model (its message).
    """
    said: list[str] = []
    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(said.append)
    try:
        model = mujoco.MjModel.from_xml_path(path)
    finally:
        mujoco.set_mju_user_warning(previous)
    for message in said:
        warnings.warn(f"MuJoCo, loading {os.path.basename(path)}: {message}", MujocoModelWarning,
                      stacklevel=3)
    return model


def model_path(xml_file: str) -> str:
    """Resolve ``xml_file`` as Gymnasium's ``expand_model_path`` does.

    Paths starting with ``.`` or ``/`` are used as given, ``~`` is expanded, anything else is a
    file of Gymnasium's MuJoCo assets folder.

    Raises:
        FileNotFoundError: the file does not exist.
    """
    if xml_file.startswith((".", "/")):
        path = xml_file
    elif xml_file.startswith("~"):
        path = os.path.expanduser(xml_file)
    else:
        path = os.path.join(_ASSET_DIR, xml_file)
    if not os.path.exists(path):
        raise FileNotFoundError(f"MuJoCo model file {path} does not exist")
    return path


def _sum_squares(x: np.ndarray) -> np.ndarray:
    """Row sums of squares of ``x (n, ...)``, as ``np.sum(np.square(row))`` per row, in x's dtype.

    Summing the flattened contiguous rows along the last axis runs NumPy's pairwise sum over each
    row exactly as the whole-array ``np.sum`` of one row does, so results are bit-identical.
    """
    return np.sum(np.square(x).reshape(len(x), -1), axis=1)


class MujocoBatch(BatchedEnv):
    """What all seven tasks share: the batch of simulations, seeding, reset noise and stepping.

    Subclasses provide the observation (`_observe`) and the reward and termination
    (`_reward_terminated`) of their Gymnasium v5 file, and the tracked x position
    (`_x_position`) whose finite difference over one step is the forward velocity.

    Args:
        num_envs: simulations, >= 1.
        num_threads: threads of MuJoCo's batch pool, the caller's included, >= 1.
        xml_file: the model, resolved by `model_path`.
        frame_skip: physics steps (``mj_step`` calls) per env step, >= 1; ``dt = timestep *
            frame_skip`` seconds.
        reset_noise_scale: half-width of the uniform noise added to ``qpos`` (and ``qvel``) at
            reset, or the standard deviation of the normal ``qvel`` noise.
        normal_qvel_noise: draw the ``qvel`` noise as ``scale * standard_normal(nv)``
            (HalfCheetah, Ant) instead of ``uniform(-scale, scale, nv)``.
        contact_forces: keep ``cfrc_ext (num_envs, nbody, 6)`` as Gymnasium computes it (Ant,
            Humanoid); makes the batch persistent and adds a per-env step loop.
        derived: ``MjData`` fields the subclass reads besides ``qpos``/``qvel``/``ctrl`` (bound
            as ``self._fields[name]``, ``(num_envs, ...)``, values as after ``mj_step``).

    Raises:
        ValueError: ``num_envs``, ``num_threads`` or ``frame_skip`` below 1.
        FileNotFoundError: ``xml_file`` does not exist.
    """

    def __init__(self, num_envs: int, num_threads: int, xml_file: str, frame_skip: int,
                 reset_noise_scale: float, normal_qvel_noise: bool = False,
                 contact_forces: bool = False, derived: Sequence[str] = ()) -> None:
        for name, value in (("num_envs", num_envs), ("num_threads", num_threads),
                            ("frame_skip", frame_skip)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        self.model = load_model(model_path(xml_file))
        data = mujoco.MjData(self.model)  # Gymnasium's init_qpos/init_qvel: a fresh MjData's
        self.init_qpos, self.init_qvel = data.qpos.copy(), data.qvel.copy()
        self.num_envs, self.frame_skip = int(num_envs), int(frame_skip)
        self.dt = self.model.opt.timestep * self.frame_skip
        self._noise, self._normal_qvel = reset_noise_scale, normal_qvel_noise
        self._batch = Batch(self.model, self.num_envs, int(num_threads), persistent=contact_forces)
        self._qpos = self._batch.bind("qpos")
        self._qvel = self._batch.bind("qvel")
        self._ctrl = self._batch.bind("ctrl")
        self._fields = {name: self._batch.bind(name) for name in derived}
        self._batch.reset()
        self._reset_row = self._batch.state[0].copy()  # mj_resetData's state (every field of it)
        self._cfrc = np.zeros((self.num_envs, self.model.nbody, 6)) if contact_forces else None
        self._scratch = mujoco.MjData(self.model) if contact_forces else None
        self._rngs = EnvGenerators(self.num_envs)
        bounds = self.model.actuator_ctrlrange.copy().astype(np.float32)
        self.action_space = spaces.Box(low=bounds[:, 0], high=bounds[:, 1], dtype=np.float32)
        self.observation_space = spaces.Box(-np.inf, np.inf, (self._obs_size(),), np.float64)
        self._obs = np.zeros((self.num_envs, self._obs_size()), np.float64)
        self._false = np.zeros(self.num_envs, bool)

    # --- BatchedEnv -----------------------------------------------------------------------------
    def reset(self, ids: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        """Start new episodes in ``ids``, as ``MujocoEnv.reset`` does per env.

        Per env, in order: re-seed its generator (``seeding.np_random(seed)``) when its seed is
        not ``None``, draw the ``qpos`` then the ``qvel`` noise of the task's ``reset_model``,
        reset the simulation (``mj_resetData``), write the noisy state and run ``mj_forward``.

        ``mj_resetData`` is a copy of a state row saved from a reset simulation (the same for
        every env; no thread-pool call). ``mj_forward`` runs only for the tasks that read derived
        fields (Ant, Humanoid): it changes no state and ``mj_step`` recomputes every derived
        field, so for the tasks that read only ``qpos``/``qvel`` it would change nothing.

        Args:
            ids: ``(n,)`` distinct env indices, any order.
            seeds: ``n`` seeds (non-negative ints) or ``None``.

        Returns:
            obs: ``(n, obs_dim) float64``, an internal buffer valid until the next call.

        Raises:
            ValueError: ``len(seeds) != len(ids)``.
            gymnasium.error.Error: a negative seed.
        """
        ids = np.asarray(ids, np.int64)
        if len(seeds) != len(ids):
            raise ValueError(f"got {len(seeds)} seeds for {len(ids)} env ids")
        qpos = np.empty((len(ids), self.model.nq))
        qvel = np.empty((len(ids), self.model.nv))
        for k, (i, seed) in enumerate(zip(ids.tolist(), seeds)):
            qpos[k], qvel[k] = self._reset_state(self._generator(i, seed))
        self._batch.state[ids] = self._reset_row
        self._qpos[ids] = qpos
        self._qvel[ids] = qvel
        if self._fields:
            self._batch.forward(np.sort(ids))
        if self._cfrc is not None:
            # mj_resetData zeroes cfrc_ext and Gymnasium's reset runs no mj_rnePostConstraint
            self._cfrc[ids] = 0.0
        return self._observe(ids, self._qpos[ids], self._qvel[ids])

    def step(self, ids: np.ndarray, actions: np.ndarray) -> StepResult:
        """Apply ``actions`` as controls and advance ``ids`` by ``frame_skip`` physics steps.

        Args:
            ids: ``(n,)`` distinct env indices, any order.
            actions: ``(n, nu)`` controls within `action_space` (written to ``ctrl`` unclipped,
                as Gymnasium does); the control cost is computed in their dtype.

        Returns:
            ``(obs (n, obs_dim) float64, reward (n,) float64, terminated (n,) bool,
            truncated (n,) bool)``; ``truncated`` is always False (the pool applies the time
            limit). ``obs`` is an internal buffer valid until the next call.

        Raises:
            mujoco.batch.SimulationError: MuJoCo raised an error in some simulation.
        """
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        x_before = self._x_position(ids)
        self._ctrl[ids] = actions
        self._batch.step(None if n == self.num_envs else np.sort(ids), nstep=self.frame_skip)
        if self._cfrc is not None:
            self._update_contact_forces(ids)
        x_velocity = (self._x_position(ids) - x_before) / self.dt
        qpos, qvel = self._qpos[ids], self._qvel[ids]
        obs = self._observe(ids, qpos, qvel)
        reward, terminated = self._reward_terminated(ids, qpos, qvel, obs, actions, x_velocity)
        return obs, reward, terminated, self._false[:n]

    def close(self) -> None:
        """Free the simulations. Idempotent; the object is unusable afterwards."""
        self._batch = self._qpos = self._qvel = self._ctrl = self._scratch = None
        self._fields = {}

    # --- shared pieces --------------------------------------------------------------------------
    def _generator(self, i: int, seed: int | None) -> np.random.Generator:
        """Env ``i``'s generator, re-seeded as ``gymnasium.Env.reset(seed=seed)`` does."""
        return self._rngs(i, seed)

    def _reset_state(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``reset_model``'s noisy ``(qpos (nq,), qvel (nv,))``, drawn qpos first."""
        low, high = -self._noise, self._noise
        qpos = self.init_qpos + rng.uniform(low=low, high=high, size=self.model.nq)
        if self._normal_qvel:
            qvel = self.init_qvel + self._noise * rng.standard_normal(self.model.nv)
        else:
            qvel = self.init_qvel + rng.uniform(low=low, high=high, size=self.model.nv)
        return qpos, qvel

    def _update_contact_forces(self, ids: np.ndarray) -> None:
        """``cfrc_ext`` of ``ids`` after ``mj_rnePostConstraint`` on each env's post-step MjData."""
        scratch, batch, model, cfrc = self._scratch, self._batch, self.model, self._cfrc
        for i in ids.tolist():
            batch.get_data(i, scratch)
            mujoco.mj_rnePostConstraint(model, scratch)
            cfrc[i] = scratch.cfrc_ext

    def _state_obs(self, qpos: np.ndarray, qvel: np.ndarray, skip: int,
                   vel_clip: float | None = None) -> np.ndarray:
        """The obs buffer's first ``n`` rows, starting ``[qpos[:, skip:], qvel]``.

        ``qvel`` is clipped to ``[-vel_clip, vel_clip]`` when given; the columns after it are
        left for the caller to fill.
        """
        n, nq = len(qpos), qpos.shape[1] - skip
        out = self._obs[:n]
        out[:, :nq] = qpos[:, skip:]
        if vel_clip is None:
            out[:, nq:nq + qvel.shape[1]] = qvel
        else:
            np.clip(qvel, -vel_clip, vel_clip, out=out[:, nq:nq + qvel.shape[1]])
        return out

    # --- per task -------------------------------------------------------------------------------
    def _obs_size(self) -> int:
        """Observation length (Gymnasium's ``obs_size``)."""
        raise NotImplementedError

    def _x_position(self, ids: np.ndarray) -> np.ndarray:
        """``(n,)`` x coordinate whose change over a step gives ``x_velocity`` (m); a copy."""
        return self._qpos[ids, 0]

    def _observe(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """``(n, obs_dim) float64`` observation of ``ids`` (``qpos (n, nq)``, ``qvel (n, nv)``)."""
        raise NotImplementedError

    def _reward_terminated(self, ids: np.ndarray, qpos: np.ndarray, qvel: np.ndarray,
                           obs: np.ndarray, actions: np.ndarray,
                           x_velocity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(reward (n,) float64, terminated (n,) bool)`` after a step."""
        raise NotImplementedError


class _PlanarWalker(MujocoBatch):
    """Hopper and Walker2d: obs ``[qpos[1:], clip(qvel, -10, 10)]``; reward
    ``(forward_reward_weight * x_velocity + healthy * healthy_reward) - ctrl_cost_weight *
    sum(action**2)``; terminated ``= not healthy and terminate_when_unhealthy``."""

    def __init__(self, num_envs, num_threads, xml_file, frame_skip, forward_reward_weight,
                 ctrl_cost_weight, healthy_reward, terminate_when_unhealthy, healthy_z_range,
                 healthy_angle_range, reset_noise_scale,
                 exclude_current_positions_from_observation):
        self._skip = 1 if exclude_current_positions_from_observation else 0
        self._forward_w, self._ctrl_w = forward_reward_weight, ctrl_cost_weight
        self._healthy_reward, self._terminate = healthy_reward, terminate_when_unhealthy
        self._z_range, self._angle_range = healthy_z_range, healthy_angle_range
        super().__init__(num_envs, num_threads, xml_file, frame_skip, reset_noise_scale)

    def _obs_size(self) -> int:
        return self.model.nq + self.model.nv - self._skip

    def _observe(self, ids, qpos, qvel):
        return self._state_obs(qpos, qvel, self._skip, vel_clip=10)

    def _healthy(self, qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
        """``(n,) bool``: z in ``healthy_z_range`` and angle in ``healthy_angle_range`` (open)."""
        z, angle = qpos[:, 1], qpos[:, 2]
        (min_z, max_z), (min_angle, max_angle) = self._z_range, self._angle_range
        return (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)

    def _reward_terminated(self, ids, qpos, qvel, obs, actions, x_velocity):
        healthy = self._healthy(qpos, qvel)
        rewards = self._forward_w * x_velocity + healthy * self._healthy_reward
        reward = rewards - self._ctrl_w * _sum_squares(actions)
        return reward, ~healthy & self._terminate


class HopperBatch(_PlanarWalker):
    """Hopper-v5 (``gymnasium/envs/mujoco/hopper_v5.py``), ``num_envs`` at once.

    obs ``(nq + nv - 1,) = (11,) float64``: ``qpos[1:]`` (m, rad) then ``qvel`` clipped to
    ``[-10, 10]``; action ``(3,) float32`` joint torques in ``[-1, 1]``. Healthy: every
    ``[qpos[2:], qvel]`` in ``healthy_state_range``, ``qpos[1]`` (z) in ``healthy_z_range`` and
    ``qpos[2]`` (angle) in ``healthy_angle_range``, all open intervals. Keyword arguments and
    defaults are Gymnasium's; ``num_threads`` is the batch's thread count.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *, xml_file: str = "hopper.xml",
                 frame_skip: int = 4, forward_reward_weight: float = 1.0,
                 ctrl_cost_weight: float = 1e-3, healthy_reward: float = 1.0,
                 terminate_when_unhealthy: bool = True,
                 healthy_state_range: tuple[float, float] = (-100.0, 100.0),
                 healthy_z_range: tuple[float, float] = (0.7, float("inf")),
                 healthy_angle_range: tuple[float, float] = (-0.2, 0.2),
                 reset_noise_scale: float = 5e-3,
                 exclude_current_positions_from_observation: bool = True) -> None:
        self._state_range = healthy_state_range
        super().__init__(num_envs, num_threads, xml_file, frame_skip, forward_reward_weight,
                         ctrl_cost_weight, healthy_reward, terminate_when_unhealthy,
                         healthy_z_range, healthy_angle_range, reset_noise_scale,
                         exclude_current_positions_from_observation)

    def _healthy(self, qpos, qvel):
        min_state, max_state = self._state_range
        state = np.concatenate((qpos[:, 2:], qvel), axis=1)
        healthy_state = np.all((min_state < state) & (state < max_state), axis=1)
        return healthy_state & super()._healthy(qpos, qvel)


class Walker2dBatch(_PlanarWalker):
    """Walker2d-v5 (``gymnasium/envs/mujoco/walker2d_v5.py``, asset ``walker2d_v5.xml``).

    obs ``(17,) float64``: ``qpos[1:]`` then ``qvel`` clipped to ``[-10, 10]``; action
    ``(6,) float32`` torques in ``[-1, 1]``. Healthy: ``qpos[1]`` (z) in ``healthy_z_range`` and
    ``qpos[2]`` (angle) in ``healthy_angle_range``, open intervals. Defaults are Gymnasium's.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *,
                 xml_file: str = "walker2d_v5.xml", frame_skip: int = 4,
                 forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 1e-3,
                 healthy_reward: float = 1.0, terminate_when_unhealthy: bool = True,
                 healthy_z_range: tuple[float, float] = (0.8, 2.0),
                 healthy_angle_range: tuple[float, float] = (-1.0, 1.0),
                 reset_noise_scale: float = 5e-3,
                 exclude_current_positions_from_observation: bool = True) -> None:
        super().__init__(num_envs, num_threads, xml_file, frame_skip, forward_reward_weight,
                         ctrl_cost_weight, healthy_reward, terminate_when_unhealthy,
                         healthy_z_range, healthy_angle_range, reset_noise_scale,
                         exclude_current_positions_from_observation)


class _ForwardOnly(MujocoBatch):
    """HalfCheetah and Swimmer: obs ``[qpos[skip:], qvel]``; reward ``forward_reward_weight *
    x_velocity - ctrl_cost_weight * sum(action**2)``; never terminates."""

    def __init__(self, num_envs, num_threads, xml_file, frame_skip, forward_reward_weight,
                 ctrl_cost_weight, reset_noise_scale, skip, normal_qvel_noise):
        self._skip = skip
        self._forward_w, self._ctrl_w = forward_reward_weight, ctrl_cost_weight
        super().__init__(num_envs, num_threads, xml_file, frame_skip, reset_noise_scale,
                         normal_qvel_noise=normal_qvel_noise)

    def _obs_size(self) -> int:
        return self.model.nq + self.model.nv - self._skip

    def _observe(self, ids, qpos, qvel):
        return self._state_obs(qpos, qvel, self._skip)

    def _reward_terminated(self, ids, qpos, qvel, obs, actions, x_velocity):
        reward = self._forward_w * x_velocity - self._ctrl_w * _sum_squares(actions)
        return reward, self._false[:len(ids)]


class HalfCheetahBatch(_ForwardOnly):
    """HalfCheetah-v5 (``gymnasium/envs/mujoco/half_cheetah_v5.py``).

    obs ``(17,) float64``: ``qpos[1:]`` then ``qvel``; action ``(6,) float32`` in ``[-1, 1]``;
    reset ``qvel`` noise is normal. Never terminates. Defaults are Gymnasium's.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *,
                 xml_file: str = "half_cheetah.xml", frame_skip: int = 5,
                 forward_reward_weight: float = 1.0, ctrl_cost_weight: float = 0.1,
                 reset_noise_scale: float = 0.1,
                 exclude_current_positions_from_observation: bool = True) -> None:
        super().__init__(num_envs, num_threads, xml_file, frame_skip, forward_reward_weight,
                         ctrl_cost_weight, reset_noise_scale,
                         skip=1 if exclude_current_positions_from_observation else 0,
                         normal_qvel_noise=True)


class SwimmerBatch(_ForwardOnly):
    """Swimmer-v5 (``gymnasium/envs/mujoco/swimmer_v5.py``).

    obs ``(8,) float64``: ``qpos[2:]`` then ``qvel``; action ``(2,) float32`` in ``[-1, 1]``;
    forward velocity from ``qpos[0]``. Never terminates. Defaults are Gymnasium's.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *, xml_file: str = "swimmer.xml",
                 frame_skip: int = 4, forward_reward_weight: float = 1.0,
                 ctrl_cost_weight: float = 1e-4, reset_noise_scale: float = 0.1,
                 exclude_current_positions_from_observation: bool = True) -> None:
        super().__init__(num_envs, num_threads, xml_file, frame_skip, forward_reward_weight,
                         ctrl_cost_weight, reset_noise_scale,
                         skip=2 if exclude_current_positions_from_observation else 0,
                         normal_qvel_noise=False)


class InvertedPendulumBatch(MujocoBatch):
    """InvertedPendulum-v5 (``gymnasium/envs/mujoco/inverted_pendulum_v5.py``).

    obs ``(4,) float64``: ``[cart x (m), pole angle (rad), cart x vel, pole angle vel]``; action
    ``(1,) float32`` in ``[-3, 3]``. Terminated when the obs is not finite or ``|angle| > 0.2``;
    reward 1 while not terminated, else 0. Defaults are Gymnasium's.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *,
                 xml_file: str = "inverted_pendulum.xml", frame_skip: int = 2,
                 reset_noise_scale: float = 0.01) -> None:
        super().__init__(num_envs, num_threads, xml_file, frame_skip, reset_noise_scale)

    def _obs_size(self) -> int:
        return self.model.nq + self.model.nv

    def _observe(self, ids, qpos, qvel):
        return self._state_obs(qpos, qvel, 0)

    def _reward_terminated(self, ids, qpos, qvel, obs, actions, x_velocity):
        terminated = ~np.isfinite(obs).all(axis=1) | (np.abs(obs[:, 1]) > 0.2)
        return (~terminated).astype(np.float64), terminated


class AntBatch(MujocoBatch):
    """Ant-v5 (``gymnasium/envs/mujoco/ant_v5.py``).

    obs ``(105,) float64``: ``qpos[2:]``, ``qvel``, then ``cfrc_ext[1:]`` (13 bodies x 6, torque
    then force, N m / N) clipped to ``contact_force_range``; action ``(8,) float32`` in
    ``[-1, 1]``. Forward velocity from body ``main_body``'s ``xpos``. Reward
    ``(x_velocity * forward_reward_weight + healthy * healthy_reward) - (ctrl_cost +
    contact_cost_weight * sum(clip(cfrc_ext)**2))``. Healthy: ``[qpos, qvel]`` finite and
    ``qpos[2]`` in the closed ``healthy_z_range``. Defaults are Gymnasium's.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *, xml_file: str = "ant.xml",
                 frame_skip: int = 5, forward_reward_weight: float = 1,
                 ctrl_cost_weight: float = 0.5, contact_cost_weight: float = 5e-4,
                 healthy_reward: float = 1.0, main_body: int | str = 1,
                 terminate_when_unhealthy: bool = True,
                 healthy_z_range: tuple[float, float] = (0.2, 1.0),
                 contact_force_range: tuple[float, float] = (-1.0, 1.0),
                 reset_noise_scale: float = 0.1,
                 exclude_current_positions_from_observation: bool = True,
                 include_cfrc_ext_in_observation: bool = True) -> None:
        self._skip = 2 if exclude_current_positions_from_observation else 0
        self._include_cfrc = include_cfrc_ext_in_observation
        self._forward_w, self._ctrl_w, self._contact_w = (forward_reward_weight, ctrl_cost_weight,
                                                           contact_cost_weight)
        self._healthy_reward, self._terminate = healthy_reward, terminate_when_unhealthy
        self._z_range, self._force_range = healthy_z_range, contact_force_range
        super().__init__(num_envs, num_threads, xml_file, frame_skip, reset_noise_scale,
                         normal_qvel_noise=True, contact_forces=True, derived=("xpos",))
        self._main_body = self.model.body(main_body).id

    def _obs_size(self) -> int:
        m = self.model
        return m.nq + m.nv - self._skip + (m.nbody - 1) * 6 * self._include_cfrc

    def _x_position(self, ids):
        return self._fields["xpos"][ids, self._main_body, 0]

    def _contact_forces(self, ids: np.ndarray) -> np.ndarray:
        """``(n, nbody, 6)`` ``cfrc_ext`` clipped to ``contact_force_range``."""
        low, high = self._force_range
        return np.clip(self._cfrc[ids], low, high)

    def _observe(self, ids, qpos, qvel):
        extra = (self.model.nbody - 1) * 6 * self._include_cfrc
        out = self._state_obs(qpos, qvel, self._skip)
        if extra:
            out[:, -extra:] = self._contact_forces(ids)[:, 1:].reshape(len(ids), -1)
        return out

    def _reward_terminated(self, ids, qpos, qvel, obs, actions, x_velocity):
        min_z, max_z = self._z_range
        z = qpos[:, 2]
        finite = np.isfinite(qpos).all(axis=1) & np.isfinite(qvel).all(axis=1)
        healthy = finite & (min_z <= z) & (z <= max_z)
        rewards = x_velocity * self._forward_w + healthy * self._healthy_reward
        ctrl_cost = self._ctrl_w * _sum_squares(actions)
        contact_cost = self._contact_w * _sum_squares(self._contact_forces(ids))
        reward = rewards - (ctrl_cost + contact_cost)
        return reward, ~healthy & self._terminate


class HumanoidBatch(MujocoBatch):
    """Humanoid-v5 (``gymnasium/envs/mujoco/humanoid_v5.py``).

    obs ``(348,) float64``: ``qpos[2:]`` (22), ``qvel`` (23), ``cinert[1:]`` (13 x 10),
    ``cvel[1:]`` (13 x 6), ``qfrc_actuator[6:]`` (17), ``cfrc_ext[1:]`` (13 x 6), each part
    optional as in Gymnasium; action ``(17,) float32`` in ``[-0.4, 0.4]``. Forward velocity from
    the mass-weighted mean of the bodies' ``xipos`` (Gymnasium's ``mass_center``). Reward
    ``(forward_reward_weight * x_velocity + healthy * healthy_reward) - (ctrl_cost_weight *
    sum(ctrl**2) + clip(contact_cost_weight * sum(cfrc_ext**2), *contact_cost_range))``.
    Healthy: ``qpos[2]`` in the open ``healthy_z_range``. Defaults are Gymnasium's.
    """

    def __init__(self, num_envs: int, num_threads: int = 1, *, xml_file: str = "humanoid.xml",
                 frame_skip: int = 5, forward_reward_weight: float = 1.25,
                 ctrl_cost_weight: float = 0.1, contact_cost_weight: float = 5e-7,
                 contact_cost_range: tuple[float, float] = (-np.inf, 10.0),
                 healthy_reward: float = 5.0, terminate_when_unhealthy: bool = True,
                 healthy_z_range: tuple[float, float] = (1.0, 2.0),
                 reset_noise_scale: float = 1e-2,
                 exclude_current_positions_from_observation: bool = True,
                 include_cinert_in_observation: bool = True,
                 include_cvel_in_observation: bool = True,
                 include_qfrc_actuator_in_observation: bool = True,
                 include_cfrc_ext_in_observation: bool = True) -> None:
        self._skip = 2 if exclude_current_positions_from_observation else 0
        self._forward_w, self._ctrl_w, self._contact_w = (forward_reward_weight, ctrl_cost_weight,
                                                           contact_cost_weight)
        self._contact_range = contact_cost_range
        self._healthy_reward, self._terminate = healthy_reward, terminate_when_unhealthy
        self._z_range = healthy_z_range
        # (field, first row kept) of the optional observation parts, in Gymnasium's order
        self._parts = [part for part, on in ((("cinert", 1), include_cinert_in_observation),
                                             (("cvel", 1), include_cvel_in_observation),
                                             (("qfrc_actuator", 6),
                                              include_qfrc_actuator_in_observation),
                                             (("cfrc_ext", 1), include_cfrc_ext_in_observation))
                       if on]
        super().__init__(num_envs, num_threads, xml_file, frame_skip, reset_noise_scale,
                         contact_forces=True,
                         derived=("xipos", "cinert", "cvel", "qfrc_actuator"))
        self._mass = self.model.body_mass.copy()
        self._mass_total = self.model.body_mass.sum()

    def _part_size(self, field: str, first: int) -> int:
        """Length of the observation part ``field[first:]``, flattened."""
        m = self.model
        rows = {"cinert": (m.nbody, 10), "cvel": (m.nbody, 6), "qfrc_actuator": (m.nv, 1),
                "cfrc_ext": (m.nbody, 6)}[field]
        return (rows[0] - first) * rows[1]

    def _obs_size(self) -> int:
        extra = sum(self._part_size(*part) for part in self._parts)
        return self.model.nq + self.model.nv - self._skip + extra

    def _x_position(self, ids):
        num = np.einsum("b,nbj->nj", self._mass, self._fields["xipos"][ids])
        return (num / self._mass_total)[:, 0]

    def _observe(self, ids, qpos, qvel):
        n = len(ids)
        extra = sum(self._part_size(*part) for part in self._parts)
        out = self._state_obs(qpos, qvel, self._skip)
        col = out.shape[1] - extra
        for field, first in self._parts:
            values = self._cfrc if field == "cfrc_ext" else self._fields[field]
            part = values[ids, first:].reshape(n, -1)
            out[:, col:col + part.shape[1]] = part
            col += part.shape[1]
        return out

    def _reward_terminated(self, ids, qpos, qvel, obs, actions, x_velocity):
        min_z, max_z = self._z_range
        z = qpos[:, 2]
        healthy = (min_z < z) & (z < max_z)
        rewards = self._forward_w * x_velocity + healthy * self._healthy_reward
        ctrl_cost = self._ctrl_w * _sum_squares(self._ctrl[ids])  # Gymnasium uses data.ctrl
        min_cost, max_cost = self._contact_range
        contact_cost = np.clip(self._contact_w * _sum_squares(self._cfrc[ids]), min_cost, max_cost)
        reward = rewards - (ctrl_cost + contact_cost)
        return reward, ~healthy & self._terminate


# task id -> (implementation, Gymnasium's max_episode_steps for it)
TASKS: dict[str, tuple[type[MujocoBatch], int]] = {
    "Hopper-v5": (HopperBatch, 1000),
    "HalfCheetah-v5": (HalfCheetahBatch, 1000),
    "Walker2d-v5": (Walker2dBatch, 1000),
    "Ant-v5": (AntBatch, 1000),
    "Humanoid-v5": (HumanoidBatch, 1000),
    "Swimmer-v5": (SwimmerBatch, 1000),
    "InvertedPendulum-v5": (InvertedPendulumBatch, 1000),
}


def engines() -> dict[str, dict[str, EngineEntry]]:
    """The ``numpy`` engine of each task of `TASKS`, with Gymnasium's episode limit (the
    registry's table: task id -> engine name -> `EngineEntry`); the class is built as
    ``cls(num_envs=N, num_threads=T, **task_kwargs)``."""
    return {task_id: {"numpy": stepped(cls, max_steps)}
            for task_id, (cls, max_steps) in TASKS.items()}
