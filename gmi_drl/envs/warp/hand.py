"""ShadowHand for the warp engine: in-hand reorientation of a block to a random goal orientation.

Source: the GMI-DRL paper Table 6 (ShadowHand: 211 observations, 20
actions); the observation (``full_state``), reward, reset noise, goal resampling and termination
follow IsaacGymEnvs' ``ShadowHand`` task with the block (``shadow_hand.py``,
``cfg/task/ShadowHand.yaml``). Physics is MuJoCo's.

The model is OpenAI's Shadow hand with its block as gymnasium-robotics ships it
(``envs/assets/hand/manipulate_block.xml``, the MJCF Isaac Gym's own asset derives from): 24
joints, 20 position actuators, coupled finger joints. Changed here with ``MjSpec``: the visual
goal body is removed (the goal is kept per world in the kernel), the hand's bodies compensate
gravity (Isaac disables the hand's gravity), its sensors are replaced by a force and a torque
sensor at each fingertip. Velocities and forces follow MuJoCo's definitions: a fingertip's
velocity is that of its body origin, the joint forces are the actuator forces.

Observation (float32, Isaac Gym's order and its (x, y, z, w) quaternions, clipped to +-5)::

    [0:24]    joint angles rescaled to [-1, 1] by their limits
    [24:48]   joint velocities x 0.2;  [48:72] joint actuator forces x 10
    [72:79]   block position and orientation;  [79:82] its linear velocity
    [82:85]   its angular velocity x 0.2
    [85:92]   goal position and orientation;  [92:96] block orientation x goal's conjugate
    [96:161]  per fingertip: position, orientation, linear and angular velocity (5 x 13)
    [161:191] per fingertip: force and torque x 10 (5 x 6)
    [191:211] the clipped actions of this step (0 in an episode's first observation)

Reward ``-10 |block - goal| + 1 / (|rotation distance| + 0.1) - 0.0002 |action|^2``, plus 250
when the rotation distance is within 0.1 rad, where a new goal orientation is drawn in the same
step (Isaac draws it at the next); each such step is a success, counted per episode in
``info["episode_successes"]``. Terminated when the block is 0.24 m or more from the goal
position (dropped), truncated after 600 steps (10 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from gmi_drl.envs.warp.assets import robotics_asset, rotate

FINGERTIPS = ("robot0:ffdistal", "robot0:mfdistal", "robot0:rfdistal", "robot0:lfdistal",
              "robot0:thdistal")


@dataclass(frozen=True)
class HandLayout:
    """Addresses in the compiled model: the hand's 24 joints (qpos/qvel, limits), the 20
    actuators' ctrl ranges, the block's free joint, the fingertip bodies and their tree roots,
    and the block's start pose (w-first quaternion)."""

    dof_qpos: np.ndarray
    dof_qvel: np.ndarray
    dof_lower: np.ndarray
    dof_upper: np.ndarray
    ctrl_lower: np.ndarray
    ctrl_upper: np.ndarray
    object_qpos: int
    object_qvel: int
    fingertips: np.ndarray
    fingertip_roots: np.ndarray
    object_init: np.ndarray


@dataclass(frozen=True)
class HandTask:
    """Isaac Gym's ``ShadowHand`` (block, ``full_state``) constants."""

    task_id: str = "ShadowHand-gmi-v0"
    model_source: str = ("OpenAI's Shadow hand and block from gymnasium-robotics "
                         "(hand/manipulate_block.xml), goal body removed, gravity compensated, "
                         "fingertip force-torque sensors")
    control_dt: float = 1.0 / 60.0
    frame_skip: int = 8  # the MJCF's 2 ms physics step: 8 per env step (Isaac: 2 of 8.3 ms)
    max_episode_steps: int = 600
    episode_metric: str = "successes"
    """goals reached per episode: ``info["episode_successes"]`` (Isaac Gym's ``successes``;
    its ``consecutive_successes`` is their running average over finished episodes)"""
    vel_obs_scale: float = 0.2
    force_torque_obs_scale: float = 10.0
    clip_obs: float = 5.0
    dist_reward_scale: float = -10.0
    rot_reward_scale: float = 1.0
    rot_eps: float = 0.1
    action_penalty_scale: float = -0.0002
    success_tolerance: float = 0.1
    reach_goal_bonus: float = 250.0
    fall_dist: float = 0.24
    reset_position_noise: float = 0.01
    reset_dof_pos_noise: float = 0.2
    goal_drop: float = 0.04  # the goal sits this far below the block's start position
    obs_dim: int = 211
    action_dim: int = 20
    policy: tuple[int, ...] = (512, 512, 512, 256)
    nconmax: int = 64
    njmax: int = 256
    kernels = "hand_kernels"
    state_dim = 4  # the goal orientation, (x, y, z, w)

    def build_model(self) -> mujoco.MjModel:
        spec = mujoco.MjSpec.from_file(
            robotics_asset(self.task_id, "hand", "manipulate_block.xml"))
        spec.delete(spec.body("target"))
        for sensor in list(spec.sensors):
            spec.delete(sensor)
        for body in spec.bodies:
            if body.name.startswith("robot0:"):
                body.gravcomp = 1.0
        for name in FINGERTIPS:
            site = spec.body(name).add_site(name=f"{name}:ft", pos=[0, 0, 0])
            for kind in (mujoco.mjtSensor.mjSENS_FORCE, mujoco.mjtSensor.mjSENS_TORQUE):
                spec.add_sensor(type=kind, objtype=mujoco.mjtObj.mjOBJ_SITE, objname=site.name)
        model = spec.compile()
        model.opt.timestep = self.control_dt / self.frame_skip
        return model

    def layout(self, model: mujoco.MjModel) -> HandLayout:
        hand = [j for j in range(model.njnt) if model.joint(j).name.startswith("robot0:")]
        obj = model.joint("object:joint")
        tips = np.array([model.body(n).id for n in FINGERTIPS], np.int32)
        return HandLayout(
            dof_qpos=model.jnt_qposadr[hand].astype(np.int32),
            dof_qvel=model.jnt_dofadr[hand].astype(np.int32),
            dof_lower=model.jnt_range[hand, 0].astype(np.float32),
            dof_upper=model.jnt_range[hand, 1].astype(np.float32),
            ctrl_lower=model.actuator_ctrlrange[:, 0].astype(np.float32),
            ctrl_upper=model.actuator_ctrlrange[:, 1].astype(np.float32),
            object_qpos=int(obj.qposadr[0]), object_qvel=int(obj.dofadr[0]),
            fingertips=tips, fingertip_roots=model.body_rootid[tips].astype(np.int32),
            object_init=model.qpos0[obj.qposadr[0]:obj.qposadr[0] + 7].astype(np.float32))

    def action_map(self, layout: HandLayout) -> tuple[np.ndarray, np.ndarray]:
        """Isaac's ``scale``: action -1 .. 1 to each actuator's range."""
        lo, hi = layout.ctrl_lower, layout.ctrl_upper
        return ((hi - lo) / 2).astype(np.float32), ((hi + lo) / 2).astype(np.float32)

    def check_model(self, model: mujoco.MjModel, layout: HandLayout) -> None:
        if len(layout.dof_qpos) != 24 or model.nu != 20 or model.nsensordata != 30:
            raise ValueError(f"{self.task_id}: the hand model has {len(layout.dof_qpos)} joints, "
                             f"{model.nu} actuators, {model.nsensordata} sensor values; "
                             "expected 24, 20, 30")


SHADOW_HAND = HandTask()


def quat_mul_xyzw(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product of (x, y, z, w) quaternions (Isaac Gym's ``quat_mul``)."""
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz])


def _xyzw(q_wxyz: np.ndarray) -> np.ndarray:
    return np.array([q_wxyz[1], q_wxyz[2], q_wxyz[3], q_wxyz[0]])


def reference_observation(task: HandTask, layout: HandLayout, qpos, qvel, qfrc, xpos, xquat,
                          cvel, subtree_com, sensordata, goal_rot, actions) -> np.ndarray:
    """One world's observation in plain NumPy float64 (``compute_full_state``)."""
    lo, hi = layout.dof_lower, layout.dof_upper
    o, v = layout.object_qpos, layout.object_qvel
    obj_rot = _xyzw(qpos[o + 3:o + 7])
    goal_pos = layout.object_init[:3] - np.array([0.0, 0.0, task.goal_drop])
    tips = []
    for b, root in zip(layout.fingertips, layout.fingertip_roots):
        ang, lin = cvel[b, :3], cvel[b, 3:]
        tips += [xpos[b], _xyzw(xquat[b]), lin + np.cross(ang, xpos[b] - subtree_com[root]), ang]
    obs = np.concatenate([
        (2 * qpos[layout.dof_qpos] - hi - lo) / (hi - lo),
        qvel[layout.dof_qvel] * task.vel_obs_scale,
        qfrc[layout.dof_qvel] * task.force_torque_obs_scale,
        qpos[o:o + 3], obj_rot, qvel[v:v + 3],
        rotate(qpos[o + 3:o + 7], qvel[v + 3:v + 6]) * task.vel_obs_scale,
        goal_pos, goal_rot, quat_mul_xyzw(obj_rot, goal_rot * [-1, -1, -1, 1]),
        *tips, sensordata * task.force_torque_obs_scale, np.clip(actions, -1, 1)])
    return np.clip(obs, -task.clip_obs, task.clip_obs)


def reference_reward(task: HandTask, layout: HandLayout, qpos, goal_rot,
                     actions) -> tuple[float, bool, bool]:
    """``(reward, goal reached, terminated)`` in plain NumPy (``compute_hand_reward``)."""
    o = layout.object_qpos
    goal_pos = layout.object_init[:3] - np.array([0.0, 0.0, task.goal_drop])
    goal_dist = float(np.linalg.norm(qpos[o:o + 3] - goal_pos))
    diff = quat_mul_xyzw(_xyzw(qpos[o + 3:o + 7]), goal_rot * [-1, -1, -1, 1])
    rot_dist = 2.0 * math.asin(min(float(np.linalg.norm(diff[:3])), 1.0))
    a = np.clip(actions, -1, 1)
    reward = (goal_dist * task.dist_reward_scale + 1.0 / (abs(rot_dist) + task.rot_eps)
              * task.rot_reward_scale + (a * a).sum() * task.action_penalty_scale)
    reached = abs(rot_dist) <= task.success_tolerance
    if reached:
        reward += task.reach_goal_bonus
    return reward, reached, goal_dist >= task.fall_dist
