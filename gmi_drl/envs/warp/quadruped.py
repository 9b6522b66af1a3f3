"""Anymal for the warp engine: an ANYmal-like quadruped tracking a commanded base velocity.

Source: the GMI-DRL paper Table 6 (Anymal: 48 observations, 12
actions); the observation, reward, PD control, reset noise and termination follow IsaacGymEnvs'
``Anymal`` task (``compute_anymal_observations``, ``compute_anymal_reward``, ``reset_idx`` and
``cfg/task/Anymal.yaml``). Physics is MuJoCo's (through MuJoCo Warp), not PhysX.

The model is authored here from primitives (`anymal_xml`): a 20 kg box base and four legs of
hip (HAA, about x), thigh (HFE, about y, 0.25 m) and shank (KFE, about y, 0.3 m, with a 3 cm
sphere foot), 36 kg in all, with ANYmal C's joint names, default angles and hip positions.
ANYmal C's URDF (the paper's model) has meshes, ~50 kg and other inertias; this body has the same
kinematic structure, not its dynamics. Each joint has a MuJoCo ``position`` actuator with
Isaac's PD gains (kp 85 N m/rad, kd 2 N m s/rad); a touch sensor on the base and on each thigh
measures contact force for the termination (Isaac's net contact force of the base and knees).
The body touches the floor only, never itself: Isaac creates the actor with collision filter 1
(``create_actor(..., i, 1, 0)``), which turns self-collisions off. The integrator is MuJoCo's
implicit-in-velocity one (``implicitfast``), as PhysX's drives are implicit: with the explicit
Euler integrator, the drives' damping on the light shanks diverged under saturated (bang-bang)
actions within 3 env steps, and the exploded worlds overflowed the constraint rows.

Observation (float32, Isaac Gym's order, clipped to +-``clip_obs``)::

    [0:3]    base linear velocity in the base frame x lin_vel_scale
    [3:6]    base angular velocity in the base frame x ang_vel_scale
    [6:9]    gravity (0, 0, -1) rotated by the base orientation (Isaac's ``quat_rotate``)
    [9:12]   command (vx, vy, yaw rate) x (lin, lin, ang) scales
    [12:24]  joint angles minus the default angles x dof_pos_scale
    [24:36]  joint velocities x dof_vel_scale
    [36:48]  the clipped actions of this step (0 in an episode's first observation)

Reward per step, clipped at 0: ``dt x (exp(-|cmd_xy - v_xy|^2 / 0.25) + 0.5 exp(-(cmd_yaw -
w_z)^2 / 0.25) - 2.5e-5 sum(torque^2))``. An episode ends when the base or a thigh touches
with more than 1 N (terminated) or after 2,500 steps (50 s; truncated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mujoco
import numpy as np

from gmi_drl.envs.warp.assets import rotate
from gmi_drl.envs.warp.locomotion import ModelLayout, model_layout

LEGS = {"LF": (1, 1), "RF": (1, -1), "LH": (-1, 1), "RH": (-1, -1)}
"""leg name -> (x sign, y sign) of its hip on the base"""

DEFAULT_ANGLES = {"LF_HAA": 0.03, "LH_HAA": 0.03, "RF_HAA": -0.03, "RH_HAA": -0.03,
                  "LF_HFE": 0.4, "LH_HFE": -0.4, "RF_HFE": 0.4, "RH_HFE": -0.4,
                  "LF_KFE": -0.8, "LH_KFE": 0.8, "RF_KFE": -0.8, "RH_KFE": 0.8}
"""Isaac Gym's ``defaultJointAngles`` (radians): the PD targets of action 0"""


def anymal_xml(timestep: float, kp: float, kd: float) -> str:
    """The MJCF of the quadruped (see the module docstring)."""
    legs = []
    for name, (fx, fy) in LEGS.items():
        legs.append(f"""
      <body name="{name}_HIP" pos="{0.277 * fx} {0.116 * fy} 0">
        <inertial pos="0 0 0" mass="2.0" diaginertia="0.003 0.003 0.003"/>
        <joint name="{name}_HAA" axis="1 0 0" range="-0.72 0.49"/>
        <geom type="capsule" fromto="0 0 0 {0.06 * fx} {0.08 * fy} 0" size="0.05"/>
        <body name="{name}_THIGH" pos="{0.06 * fx} {0.08 * fy} 0">
          <inertial pos="0 0 -0.125" mass="1.5" diaginertia="0.01 0.01 0.002"/>
          <joint name="{name}_HFE" axis="0 1 0" range="-9.42 9.42"/>
          <geom type="capsule" fromto="0 0 0 0 0 -0.25" size="0.04"/>
          <site name="{name}_THIGH_touch" type="capsule" fromto="0 0 0 0 0 -0.25"
                size="0.045"/>
          <body name="{name}_SHANK" pos="0 0 -0.25">
            <inertial pos="0 0 -0.15" mass="0.5" diaginertia="0.005 0.005 0.0005"/>
            <joint name="{name}_KFE" axis="0 1 0" range="-9.42 9.42"/>
            <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.025"/>
            <geom type="sphere" pos="0 0 -0.3" size="0.03"/>
          </body>
        </body>
      </body>""")
    joints = [f"{leg}_{j}" for leg in LEGS for j in ("HAA", "HFE", "KFE")]
    actuators = "\n".join(f'    <position name="{j}" joint="{j}" kp="{kp}" kv="{kd}"/>'
                          for j in joints)
    touch = "\n".join(f'    <touch site="{leg}_THIGH_touch"/>' for leg in LEGS)
    return f"""<mujoco model="anymal-gmi">
  <option timestep="{timestep}" integrator="implicitfast"/>
  <default><geom friction="1 0.005 0.0001" condim="3" contype="0" conaffinity="1"/></default>
  <worldbody>
    <geom name="floor" type="plane" size="0 0 0.05" contype="1"/>
    <body name="base" pos="0 0 0.62">
      <freejoint/>
      <inertial pos="0 0 0" mass="20" diaginertia="0.25 0.9 1.0"/>
      <geom type="box" size="0.27 0.135 0.07"/>
      <site name="base_touch" type="box" size="0.28 0.145 0.08"/>{"".join(legs)}
    </body>
  </worldbody>
  <actuator>
{actuators}
  </actuator>
  <sensor>
    <touch site="base_touch"/>
{touch}
  </sensor>
</mujoco>"""


@dataclass(frozen=True)
class QuadrupedTask:
    """A velocity-tracking quadruped task with Isaac Gym's ``Anymal`` constants.

    Attributes:
        control_dt: seconds per env step (Isaac's ``sim.dt`` 0.02, in ``frame_skip`` 2 physics
            steps, Isaac's substeps).
        reward scales are per second: the kernel multiplies them by ``control_dt``, as Isaac.
        commands: ``(low, high)`` of the command drawn uniformly at each reset: forward and
            sideways velocity (m/s), yaw rate (rad/s).
    """

    task_id: str = "Anymal-gmi-v0"
    model_source: str = ("authored from primitives in gmi_drl/envs/warp/quadruped.py: ANYmal C's "
                         "joint layout, names and default angles, 36 kg (ANYmal C's URDF with "
                         "meshes, ~50 kg, is the paper's)")
    control_dt: float = 0.02
    frame_skip: int = 2
    max_episode_steps: int = 2500
    lin_vel_scale: float = 2.0
    ang_vel_scale: float = 0.25
    dof_pos_scale: float = 1.0
    dof_vel_scale: float = 0.05
    action_scale: float = 0.5
    kp: float = 85.0
    kd: float = 2.0
    rew_lin_vel_xy: float = 1.0
    rew_ang_vel_z: float = 0.5
    rew_torque: float = -0.000025
    clip_obs: float = 5.0
    contact_threshold: float = 1.0
    commands: tuple[tuple[float, float], ...] = field(
        default=((-2.0, 2.0), (-1.0, 1.0), (-1.0, 1.0)))
    obs_dim: int = 48
    action_dim: int = 12
    policy: tuple[int, ...] = (256, 128, 64)
    nconmax: int = 48
    njmax: int = 128
    kernels = "quadruped_kernels"
    state_dim = 3

    def build_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(
            anymal_xml(self.control_dt / self.frame_skip, self.kp, self.kd))

    def layout(self, model: mujoco.MjModel) -> ModelLayout:
        """The joint layout, with Isaac's default angles as the reset pose (`dof_initial`)."""
        layout = model_layout(model)
        names = [model.joint(j).name for j in range(1, model.njnt)]
        initial = np.array([DEFAULT_ANGLES[n] for n in names], np.float32)
        return ModelLayout(**{**layout.__dict__, "dof_initial": initial})

    def action_map(self, layout: ModelLayout) -> tuple[np.ndarray, np.ndarray]:
        """``ctrl = action_scale x action + default angle`` of the actuator's joint."""
        nu = len(layout.act_dof)
        return (np.full(nu, self.action_scale, np.float32),
                layout.dof_initial[layout.act_dof].astype(np.float32))

    def check_model(self, model: mujoco.MjModel, layout: ModelLayout) -> None:
        if 12 + 3 * layout.ndof != self.obs_dim or model.nu != self.action_dim:
            raise ValueError(f"{self.task_id}: the model has {layout.ndof} joints and "
                             f"{model.nu} actuators, not 12")


ANYMAL = QuadrupedTask()


def reference_observation(task: QuadrupedTask, layout: ModelLayout, qpos: np.ndarray,
                          qvel: np.ndarray, command: np.ndarray,
                          actions: np.ndarray) -> np.ndarray:
    """One world's observation in plain NumPy float64 (``compute_anymal_observations``)."""
    quat = qpos[3:7]
    lin = rotate(quat, qvel[:3], inverse=True) * task.lin_vel_scale
    ang = qvel[3:6] * task.ang_vel_scale  # MuJoCo's free joint: already in the base frame
    gravity = rotate(quat, np.array([0.0, 0.0, -1.0]))
    scales = np.array([task.lin_vel_scale, task.lin_vel_scale, task.ang_vel_scale])
    obs = np.concatenate([lin, ang, gravity, command * scales,
                          (qpos[layout.dof_qpos] - layout.dof_initial) * task.dof_pos_scale,
                          qvel[layout.dof_qvel] * task.dof_vel_scale, np.clip(actions, -1, 1)])
    return np.clip(obs, -task.clip_obs, task.clip_obs)


def reference_reward(task: QuadrupedTask, layout: ModelLayout, qpos: np.ndarray,
                     qvel: np.ndarray, command: np.ndarray, torques: np.ndarray,
                     touch: np.ndarray) -> tuple[float, bool]:
    """``(reward, terminated)`` of one step in plain NumPy (``compute_anymal_reward``):
    ``torques (ndof,)`` the actuator forces at the joints, ``touch (5,)`` base and thighs."""
    lin = rotate(qpos[3:7], qvel[:3], inverse=True)
    lin_err = ((command[:2] - lin[:2]) ** 2).sum()
    ang_err = (command[2] - qvel[5]) ** 2
    dt = task.control_dt
    total = (math.exp(-lin_err / 0.25) * task.rew_lin_vel_xy * dt
             + math.exp(-ang_err / 0.25) * task.rew_ang_vel_z * dt
             + (torques ** 2).sum() * task.rew_torque * dt)
    return max(total, 0.0), bool((touch > task.contact_threshold).any())
