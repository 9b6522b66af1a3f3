"""FrankaCabinet for the warp engine: a Franka arm opens the top drawer of a cabinet.

Source: the GMI-DRL paper Table 6 (FrankaCabinet: 23 observations, 9
actions); the observation, relative PD targets, reward (distance, gripper alignment, fingers
around the handle, opening, bonuses and the "bad style" penalty), reset noise and termination
follow IsaacGymEnvs' ``FrankaCabinet`` task (``franka_cabinet.py``,
``cfg/task/FrankaCabinet.yaml``) without its 16 props in the drawer. Physics is MuJoCo's.

The arm is the Franka Panda MJCF that gymnasium-robotics ships for its kitchen
(``kitchen_franka/franka_assets``: 7 arm joints, 2 finger slides, position actuators of kp 870 /
120 / 500), mounted at (1, 0, 0) facing -x as in Isaac, its gravity compensated (Isaac disables
it). The cabinet is authored from boxes (`franka_xml`): a carcass whose front is at x = 0.45 m
and a top drawer on a slide joint along +x (0..0.45 m, damping 10) with a bar handle; Isaac's
Sektion cabinet has four drawers and doors, and its URDF frames, so the arm's default pose
points its gripper at the handle from another angle. The grasp frames: the gripper's between
the finger pads (its z forward, its y the fingers' opening axis), the drawer's 0.3 m in front of
the drawer body at the handle (Isaac's ``drawer_local_grasp_pose``).

Observation (float32, clipped to +-5): joint positions rescaled to [-1, 1] by their limits (9),
joint velocities x 0.1 (9), drawer grasp point minus gripper grasp point (3), drawer opening (m)
and its velocity. An action moves each joint's PD target: ``target += speed x dt x 7.5 x
action`` (speed 1 for the arm, 0.1 for the fingers), clamped to the joint's limits. Terminated
when the drawer is open more than 0.39 m, truncated after 500 steps.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import mujoco
import numpy as np

from gmi_drl.envs.warp.assets import robotics_asset, rotate

DEFAULT_DOF_POS = (1.157, -1.066, -0.155, -2.239, -1.841, 1.003, 0.469, 0.035, 0.035)
"""Isaac Gym's ``franka_default_dof_pos`` (rad; m for the fingers)"""

GRASP_IN_LINK7 = (0.0, 0.0, 0.1654 + 0.0775)
"""the gripper's grasp point in ``panda0_link7``'s frame: between the finger pads"""
GRASP_ROT_IN_LINK7 = (0.92388, 0.0, 0.0, -0.382683)
"""the grasp frame's orientation in ``panda0_link7``'s frame (w first): the fingers'"""
DRAWER_GRASP = (0.3, 0.01, 0.0)
"""the drawer's grasp point in the drawer body's frame (Isaac's ``drawer_local_grasp_pose``)"""


def franka_xml(timestep: float) -> str:
    """The scene: gymnasium-robotics' Franka (by include) and the authored cabinet."""
    return f"""<mujoco model="franka-cabinet-gmi">
  <include file="franka_assets/assets.xml"/>
  <option timestep="{timestep}" integrator="implicitfast"/>
  <worldbody>
    <geom name="floor" type="plane" size="0 0 0.05"/>
    <body name="franka" pos="1 0 0" quat="0 0 0 1">
      <include file="franka_assets/chain.xml"/>
    </body>
    <body name="cabinet" pos="0 0 0">
      <geom type="box" pos="0.25 0 0.45" size="0.2 0.3 0.45" rgba=".8 .8 .75 1"/>
      <body name="drawer_top" pos="0.2 0 0.7">
        <joint name="drawer_top_joint" type="slide" axis="1 0 0" range="0 0.45" damping="10"/>
        <geom type="box" pos="0.05 0 0" size="0.2 0.25 0.08" density="100" rgba=".7 .7 .65 1"/>
        <geom type="capsule" fromto="0.3 -0.1 0 0.3 0.1 0" size="0.01" density="100"/>
        <geom type="box" pos="0.275 -0.09 0" size="0.025 0.008 0.008" density="100"/>
        <geom type="box" pos="0.275 0.09 0" size="0.025 0.008 0.008" density="100"/>
      </body>
    </body>
  </worldbody>
  <contact><exclude body1="cabinet" body2="drawer_top"/></contact>
  <include file="franka_assets/actuator.xml"/>
</mujoco>"""


@dataclass(frozen=True)
class FrankaLayout:
    """Addresses in the compiled model: the Franka's 9 joints (qpos/qvel, limits), the drawer
    joint's qpos/qvel, and the bodies the rewards read."""

    dof_qpos: np.ndarray
    dof_qvel: np.ndarray
    dof_lower: np.ndarray
    dof_upper: np.ndarray
    drawer_qpos: int
    drawer_qvel: int
    hand: int
    lfinger: int
    rfinger: int
    drawer: int


@dataclass(frozen=True)
class FrankaTask:
    """Isaac Gym's ``FrankaCabinet`` constants."""

    task_id: str = "FrankaCabinet-gmi-v0"
    model_source: str = ("gymnasium-robotics' kitchen Franka Panda, gravity compensated, and a "
                         "cabinet with one drawer authored in gmi_drl/envs/warp/franka.py")
    control_dt: float = 1.0 / 60.0
    frame_skip: int = 2
    max_episode_steps: int = 500
    action_scale: float = 7.5
    dof_vel_scale: float = 0.1
    dist_reward_scale: float = 2.0
    rot_reward_scale: float = 0.5
    around_handle_reward_scale: float = 0.25
    open_reward_scale: float = 7.5
    finger_dist_reward_scale: float = 5.0
    action_penalty_scale: float = 0.01
    dist_x_offset: float = 0.04
    open_distance: float = 0.39
    clip_obs: float = 5.0
    obs_dim: int = 23
    action_dim: int = 9
    policy: tuple[int, ...] = (256, 128, 64)
    nconmax: int = 64
    njmax: int = 512  # a finger on the drawer: 25 contacts of condim 6 (10 rows each)
    kernels = "franka_kernels"
    state_dim = 9  # the PD targets of the Franka's joints

    def build_model(self) -> mujoco.MjModel:
        with tempfile.TemporaryDirectory() as tmp:  # the includes resolve beside the scene
            os.symlink(robotics_asset(self.task_id, "kitchen_franka", "franka_assets"),
                       os.path.join(tmp, "franka_assets"))
            path = os.path.join(tmp, "scene.xml")
            with open(path, "w") as f:
                f.write(franka_xml(self.control_dt / self.frame_skip))
            spec = mujoco.MjSpec.from_file(path)
            for body in spec.bodies:
                if body.name.startswith("panda0_"):
                    body.gravcomp = 1.0
            return spec.compile()

    def layout(self, model: mujoco.MjModel) -> FrankaLayout:
        joints = [j for j in range(model.njnt) if model.joint(j).name.startswith("robot:")]
        drawer = model.joint("drawer_top_joint")
        return FrankaLayout(
            dof_qpos=model.jnt_qposadr[joints].astype(np.int32),
            dof_qvel=model.jnt_dofadr[joints].astype(np.int32),
            dof_lower=model.jnt_range[joints, 0].astype(np.float32),
            dof_upper=model.jnt_range[joints, 1].astype(np.float32),
            drawer_qpos=int(drawer.qposadr[0]), drawer_qvel=int(drawer.dofadr[0]),
            hand=model.body("panda0_link7").id, lfinger=model.body("panda0_leftfinger").id,
            rfinger=model.body("panda0_rightfinger").id, drawer=model.body("drawer_top").id)

    def check_model(self, model: mujoco.MjModel, layout: FrankaLayout) -> None:
        if len(layout.dof_qpos) != 9 or model.nu != 9:
            raise ValueError(f"{self.task_id}: the model has {len(layout.dof_qpos)} Franka "
                             f"joints and {model.nu} actuators, not 9 and 9")


FRANKA_CABINET = FrankaTask()


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(4)
    mujoco.mju_mulQuat(out, a, b)
    return out


def grasp_frames(xpos: np.ndarray, xquat: np.ndarray, layout: FrankaLayout):
    """``(gripper pos, gripper quat, drawer pos, drawer quat)`` (w-first) of one world's body
    poses, in plain NumPy (Isaac's ``compute_grasp_transforms``)."""
    h, dr = layout.hand, layout.drawer
    gpos = xpos[h] + rotate(xquat[h], np.array(GRASP_IN_LINK7))
    grot = _quat_mul(xquat[h], np.array(GRASP_ROT_IN_LINK7))
    dpos = xpos[dr] + rotate(xquat[dr], np.array(DRAWER_GRASP))
    return gpos, grot, dpos, xquat[dr]


def reference_observation(task: FrankaTask, layout: FrankaLayout, qpos, qvel, xpos,
                          xquat) -> np.ndarray:
    """One world's observation in plain NumPy float64 (``compute_observations``)."""
    lo, hi = layout.dof_lower, layout.dof_upper
    gpos, _, dpos, _ = grasp_frames(xpos, xquat, layout)
    obs = np.concatenate([2.0 * (qpos[layout.dof_qpos] - lo) / (hi - lo) - 1.0,
                          qvel[layout.dof_qvel] * task.dof_vel_scale, dpos - gpos,
                          [qpos[layout.drawer_qpos], qvel[layout.drawer_qvel]]])
    return np.clip(obs, -task.clip_obs, task.clip_obs)


def reference_reward(task: FrankaTask, layout: FrankaLayout, qpos, xpos, xquat,
                     actions) -> tuple[float, bool]:
    """``(reward, terminated)`` in plain NumPy (``compute_franka_reward``)."""
    gpos, grot, dpos, drot = grasp_frames(xpos, xquat, layout)
    d = float(np.linalg.norm(gpos - dpos))
    dist = (1.0 / (1.0 + d * d)) ** 2 * (2.0 if d <= 0.02 else 1.0)
    dot1 = rotate(grot, np.array([0.0, 0, 1])) @ rotate(drot, np.array([-1.0, 0, 0]))
    dot2 = rotate(grot, np.array([0.0, 1, 0])) @ rotate(drot, np.array([0.0, 0, 1]))
    rot = 0.5 * (math.copysign(dot1 * dot1, dot1) + math.copysign(dot2 * dot2, dot2))
    lz, rz = xpos[layout.lfinger][2], xpos[layout.rfinger][2]
    around = 0.5 if lz > dpos[2] and rz < dpos[2] else 0.0
    finger = ((0.04 - abs(lz - dpos[2])) + (0.04 - abs(rz - dpos[2]))) if around else 0.0
    a = np.clip(actions, -1, 1)
    opening = qpos[layout.drawer_qpos]
    t = task
    r = (t.dist_reward_scale * dist + t.rot_reward_scale * rot
         + t.around_handle_reward_scale * around
         + t.open_reward_scale * (opening * around + opening)
         + t.finger_dist_reward_scale * finger - t.action_penalty_scale * (a * a).sum())
    r += (0.5 if opening > 0.01 else 0.0) + (around if opening > 0.2 else 0.0)
    r += 2.0 * around if opening > 0.39 else 0.0
    if (xpos[layout.lfinger][0] < dpos[0] - t.dist_x_offset
            or xpos[layout.rfinger][0] < dpos[0] - t.dist_x_offset):
        r = -1.0
    return r, bool(opening > t.open_distance)
