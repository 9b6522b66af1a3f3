"""Ant and Humanoid for the warp engine: models, constants and NumPy references.

Source: the GMI-DRL paper Table 6, which trains Isaac Gym's tasks. The
observation, reward, reset noise and termination of each task follow the Isaac Gym task
definitions the paper used (IsaacGymEnvs ``Ant`` and ``Humanoid``: ``compute_*_observations``,
``compute_*_reward``, ``reset_idx`` and their ``cfg/task/*.yaml`` constants); physics is MuJoCo's
(through MuJoCo Warp), not PhysX, and the models are MJCF that ships with a dependency (named in
each `LocomotionTask`). Both tasks share one kernel (`gmi_drl.envs.warp.locomotion_kernels`):
they are the same "walk to a target 1 km away along +x" task on different bodies. This module
needs no Warp (the registry reads it); the NumPy references here are what the tests hold the
kernel to.

A task's observation (float32, Isaac Gym's order), with ``ndof`` hinge joints and ``nu``
actuators::

    [0]       torso height (z)
    [1:4]     torso linear velocity in the torso frame
    [4:7]     torso angular velocity in the torso frame, times ``angular_velocity_scale``
    [7:10]    yaw, roll, angle to target (radians, in (-pi, pi])
    [10]      up projection (z of the torso's up axis);  [11] heading projection to target
    then      joint positions rescaled to [-1, 1] by their limits      (ndof)
              joint velocities times ``dof_vel_scale``                 (ndof)
              joint actuator forces times ``contact_force_scale``      (ndof, Humanoid only)
              foot force/torque sensors times ``contact_force_scale``  (6 per foot)
              the clipped actions of this step                         (nu)

The first observation of an episode is taken from the reset state before any force acted on
it: its force, sensor and action terms are 0 (Isaac Gym returns stale values there).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import mujoco
import numpy as np

# ``LocomotionParams.limit_cost``: how joints near their limits are charged
LIMIT_COUNT = 0  # Ant: joints_at_limit_cost x (number of joints with scaled position > 0.99)
LIMIT_SCALED = 1  # Humanoid: sum over |scaled| > 0.98 of cost x (|s| - 0.98) / 0.02 x effort


@dataclass(frozen=True)
class LocomotionTask:
    """One task: its model, its Isaac Gym constants and its sizes (Table 6).

    Attributes:
        task_id: registered name (``Ant-gmi-v0``).
        model_source: what the MJCF is and how it differs from the paper's model (docstrings).
        control_dt: seconds per env step (Isaac Gym: 1/60 s as ``0.0166``).
        frame_skip: physics steps per env step (Isaac Gym's ``substeps``: 2).
        feet: the bodies whose force/torque sensors enter the observation; ``None``: every leaf
            body of the kinematic tree (the Ant's four lower legs, unnamed in Gymnasium's MJCF).
        max_episode_steps: env steps after which an episode is truncated (``episodeLength``).
        policy: the policy's hidden sizes in Table 6.
        nconmax, njmax: MuJoCo Warp's contacts and constraint rows per world, sized for a body
            lying on the ground with its joints at their limits (`WarpPool.check_limits`).
        integrator: MuJoCo's integrator by name (``"implicitfast"``, ...); ``None``: the MJCF's
            own. Isaac's PhysX integrates joint damping implicitly; MuJoCo's explicit Euler at
            Isaac's step diverges on bodies with light, damped limbs (the humanoid).
    """

    task_id: str
    model_source: str
    xml_path: str
    control_dt: float
    frame_skip: int
    feet: tuple[str, ...] | None
    max_episode_steps: int
    dof_force_obs: bool
    dof_vel_scale: float
    angular_velocity_scale: float
    contact_force_scale: float
    heading_weight: float
    up_weight: float
    actions_cost: float
    energy_cost: float
    joints_at_limit_cost: float
    limit_cost: int
    alive_reward: float
    death_cost: float
    termination_height: float
    obs_dim: int
    action_dim: int
    policy: tuple[int, ...]
    nconmax: int = 48
    njmax: int = 128
    integrator: str | None = None
    kernels = "locomotion_kernels"
    state_dim = 0

    def build_model(self) -> mujoco.MjModel:
        return build_model(self)

    def layout(self, model: mujoco.MjModel) -> "ModelLayout":
        return model_layout(model)

    def action_map(self, layout: "ModelLayout") -> tuple[np.ndarray, np.ndarray]:
        """``(scale, offset) (nu,) float32``: ``ctrl = action x scale + offset`` (the motor
        command itself here)."""
        nu = len(layout.act_dof)
        return np.ones(nu, np.float32), np.zeros(nu, np.float32)

    def check_model(self, model: mujoco.MjModel, layout: "ModelLayout") -> None:
        """Raise ``ValueError`` where the model does not give Table 6's sizes."""
        size = (12 + 2 * layout.ndof + model.nu + layout.nsensordata
                + (layout.ndof if self.dof_force_obs else 0))
        if size != self.obs_dim or model.nu != self.action_dim:
            raise ValueError(f"{self.task_id}: the model gives obs {size} and actions "
                             f"{model.nu}, not {self.obs_dim} and {self.action_dim}")


def _gymnasium_asset(name: str) -> str:
    import gymnasium

    return os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", name)


def _mujoco_warp_asset(*parts: str) -> str:
    import mujoco_warp

    return os.path.join(os.path.dirname(mujoco_warp.__file__), "test_data", *parts)


ANT = LocomotionTask(
    task_id="Ant-gmi-v0",
    model_source=("Gymnasium's ant.xml (Ant-v5's model: 8 hinge joints, motor gear 150, torso "
                  "starting 0.75 m up); Isaac Gym's nv_ant.xml is the same body plan with gear "
                  "15, other masses and a torso starting 0.44 m up"),
    xml_path="gymnasium:ant.xml", control_dt=0.0166, frame_skip=2, feet=None,
    max_episode_steps=1000, dof_force_obs=False, dof_vel_scale=0.2, angular_velocity_scale=1.0,
    contact_force_scale=0.1, heading_weight=0.5, up_weight=0.1, actions_cost=0.005,
    energy_cost=0.05, joints_at_limit_cost=0.1, limit_cost=LIMIT_COUNT, alive_reward=0.5,
    death_cost=-2.0, termination_height=0.31, obs_dim=60, action_dim=8, policy=(256, 128, 64))

HUMANOID = LocomotionTask(
    task_id="Humanoid-gmi-v0",
    model_source=("MuJoCo's humanoid (the copy shipped in mujoco-warp's test_data: 21 hinge "
                  "joints, 21 motors of gear 20-120, the dm_control body); Isaac Gym's "
                  "nv_humanoid.xml is the same 21-joint body with its own gears and masses"),
    xml_path="mujoco_warp:humanoid/humanoid.xml", control_dt=0.0166, frame_skip=2,
    feet=("foot_right", "foot_left"), max_episode_steps=1000, dof_force_obs=True,
    dof_vel_scale=0.1, angular_velocity_scale=0.25, contact_force_scale=0.01,
    heading_weight=0.5, up_weight=0.1, actions_cost=0.01, energy_cost=0.05,
    joints_at_limit_cost=0.25, limit_cost=LIMIT_SCALED, alive_reward=2.0, death_cost=-1.0,
    termination_height=0.8, obs_dim=108, action_dim=21, policy=(200, 400, 100), njmax=256,
    integrator="implicitfast")

TARGET = (1000.0, 0.0, 0.0)
"""Isaac Gym's walk target, metres (the potential is the distance to it in the ground plane)."""


def resolve_xml(path: str) -> str:
    """An on-disk path for ``"gymnasium:<file>"``, ``"mujoco_warp:<file>"`` or a plain path."""
    source, _, name = path.partition(":")
    if source == "gymnasium":
        return _gymnasium_asset(name)
    if source == "mujoco_warp":
        return _mujoco_warp_asset(*name.split("/"))
    return path


def build_model(task: LocomotionTask) -> mujoco.MjModel:
    """The task's `mujoco.MjModel`: its MJCF with a site and a force and torque sensor on each
    foot, ``timestep = control_dt / frame_skip`` and the task's integrator."""
    spec = mujoco.MjSpec.from_file(resolve_xml(task.xml_path))
    bodies = [b for b in spec.bodies if b.name != "world"]
    if task.feet is None:
        parents = {b.parent.name for b in bodies if b.parent is not None}
        feet = [b for b in bodies if b.name not in parents or not b.name]
        feet = [b for b in feet if not b.bodies]
    else:
        by_name = {b.name: b for b in bodies}
        feet = [by_name[name] for name in task.feet]
    for k, body in enumerate(feet):
        if not body.name:
            body.name = f"foot_{k}"
        site = body.add_site(name=f"{body.name}_ft", pos=[0, 0, 0])
        for kind in (mujoco.mjtSensor.mjSENS_FORCE, mujoco.mjtSensor.mjSENS_TORQUE):
            spec.add_sensor(type=kind, objtype=mujoco.mjtObj.mjOBJ_SITE, objname=site.name)
    model = spec.compile()
    model.opt.timestep = task.control_dt / task.frame_skip
    if task.integrator is not None:
        model.opt.integrator = getattr(mujoco.mjtIntegrator, f"mjINT_{task.integrator.upper()}")
    return model


@dataclass(frozen=True)
class ModelLayout:
    """What the task kernel needs to know about a compiled model (all host arrays).

    Attributes:
        dof_qpos, dof_qvel: ``(ndof,) int32`` addresses of each hinge joint in qpos / qvel.
        dof_lower, dof_upper: ``(ndof,) float32`` joint limits (radians).
        dof_initial: ``(ndof,) float32`` the reset pose before noise: 0 clamped into the limits.
        act_dof: ``(nu,) int32`` the joint (index into the hinge joints) each actuator drives.
        act_effort: ``(nu,) float32`` each actuator's gear over the largest gear.
        dof_effort: ``(ndof,) float32`` the effort ratio of the actuator driving each joint.
        root_qpos: ``(7,) float32`` the free joint's reset position and quaternion (w, x, y, z).
    """

    dof_qpos: np.ndarray
    dof_qvel: np.ndarray
    dof_lower: np.ndarray
    dof_upper: np.ndarray
    dof_initial: np.ndarray
    act_dof: np.ndarray
    act_effort: np.ndarray
    dof_effort: np.ndarray
    root_qpos: np.ndarray
    nsensordata: int

    @property
    def ndof(self) -> int:
        return len(self.dof_qpos)


def model_layout(model: mujoco.MjModel) -> ModelLayout:
    """Read the joint and actuator layout of a floating-base model.

    Raises:
        ValueError: the model's first joint is not a free joint, a later joint is not a hinge, or
            an actuator does not drive a hinge joint.
    """
    if model.njnt < 2 or model.jnt_type[0] != mujoco.mjtJoint.mjJNT_FREE:
        raise ValueError("a locomotion task needs a free root joint first")
    hinges = list(range(1, model.njnt))
    if any(model.jnt_type[j] != mujoco.mjtJoint.mjJNT_HINGE for j in hinges):
        raise ValueError("every joint after the root must be a hinge")
    lower = model.jnt_range[hinges, 0].astype(np.float32)
    upper = model.jnt_range[hinges, 1].astype(np.float32)
    act_joint = model.actuator_trnid[:, 0]
    if (model.actuator_trntype != mujoco.mjtTrn.mjTRN_JOINT).any() or (act_joint < 1).any():
        raise ValueError("every actuator must drive one hinge joint")
    gear = model.actuator_gear[:, 0].astype(np.float32)
    effort = gear / gear.max()
    dof_effort = np.zeros(len(hinges), np.float32)
    dof_effort[act_joint - 1] = effort
    return ModelLayout(
        dof_qpos=model.jnt_qposadr[hinges].astype(np.int32),
        dof_qvel=model.jnt_dofadr[hinges].astype(np.int32),
        dof_lower=lower, dof_upper=upper,
        dof_initial=np.clip(np.float32(0.0), lower, upper).astype(np.float32),
        act_dof=(act_joint - 1).astype(np.int32), act_effort=effort, dof_effort=dof_effort,
        root_qpos=model.qpos0[:7].astype(np.float32), nsensordata=model.nsensordata)


def reference_observation(task: LocomotionTask, layout: ModelLayout, qpos: np.ndarray,
                          qvel: np.ndarray, sensordata: np.ndarray, qfrc_actuator: np.ndarray,
                          actions: np.ndarray) -> np.ndarray:
    """The observation of one recorded state, in plain NumPy float64 (the tests' reference of
    the kernel), from the formulas of Isaac Gym's ``compute_*_observations``."""
    from gmi_drl.envs.warp.assets import rotate

    pos, quat = qpos[:3], qpos[3:7]
    qw, x, y, z = quat
    to_target = np.array(TARGET) - pos
    to_target[2] = 0.0
    up, heading = rotate(quat, [0.0, 0, 1])[2], rotate(quat, [1.0, 0, 0])
    roll = math.atan2(2 * (qw * x + y * z), qw * qw - x * x - y * y + z * z)
    yaw = math.atan2(2 * (qw * z + x * y), qw * qw + x * x - y * y - z * z)
    angle = math.atan2(TARGET[2] - pos[2], TARGET[0] - pos[0]) - yaw
    lo, hi = layout.dof_lower, layout.dof_upper
    parts = [[pos[2]], rotate(quat, qvel[:3], inverse=True),
             qvel[3:6] * task.angular_velocity_scale,
             [yaw, roll, math.atan2(math.sin(angle), math.cos(angle)), up,
              heading @ (to_target / max(np.linalg.norm(to_target), 1e-9))],
             (2 * qpos[layout.dof_qpos] - hi - lo) / (hi - lo),
             qvel[layout.dof_qvel] * task.dof_vel_scale]
    if task.dof_force_obs:
        parts.append(qfrc_actuator[layout.dof_qvel] * task.contact_force_scale)
    parts += [sensordata * task.contact_force_scale, np.clip(actions, -1, 1)]
    return np.concatenate([np.asarray(p, np.float64).ravel() for p in parts])


def reference_reward(task: LocomotionTask, layout: ModelLayout, obs: np.ndarray,
                     actions: np.ndarray, progress: float) -> tuple[float, bool]:
    """``(reward, terminated)`` of one step from its observation, in plain NumPy (Isaac Gym's
    ``compute_*_reward``); ``progress`` is the potential's change this step."""
    ndof = layout.ndof
    a = np.clip(actions, -1, 1)
    heading = obs[11]
    heading_reward = task.heading_weight if heading > 0.8 else task.heading_weight * heading / 0.8
    up_reward = task.up_weight if obs[10] > 0.93 else 0.0
    dof_vel = obs[12 + ndof:12 + 2 * ndof][layout.act_dof]
    scaled = obs[12:12 + ndof]
    if task.limit_cost == LIMIT_COUNT:
        electricity = np.abs(a * dof_vel).sum()
        limit = task.joints_at_limit_cost * (scaled > 0.99).sum()
    else:
        electricity = (np.abs(a * dof_vel) * layout.act_effort).sum()
        over = np.abs(scaled) > 0.98
        limit = (over * task.joints_at_limit_cost * (np.abs(scaled) - 0.98) / 0.02
                 * layout.dof_effort).sum()
    total = (progress + task.alive_reward + up_reward + heading_reward
             - task.actions_cost * (a * a).sum() - task.energy_cost * electricity - limit)
    fell = obs[0] < task.termination_height
    return (task.death_cost if fell else float(total)), bool(fell)
