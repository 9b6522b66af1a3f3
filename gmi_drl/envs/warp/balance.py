"""BallBalance for the warp engine: a tray on three legs keeps a falling ball near its centre.

Source: the GMI-DRL paper Table 6 (BallBalance: 24 observations, 3
actions); the model, observation, reward, action integration, reset and termination follow
IsaacGymEnvs' ``BallBalance`` task (``ball_balance.py``, ``cfg/task/BallBalance.yaml``).

The model is Isaac Gym's own MJCF, built the same way here (`balance_xml`): a free tray (radius
0.5 m) on three two-segment legs 120 degrees apart, whose feet are held at fixed points on the
ground (Isaac's stiff attractors; here MuJoCo ``connect`` equality constraints), and a free ball
(radius 0.1 m); the robot's parts do not collide with each other (only the ball touches them).
The lower leg joints are actuated by PD position drives (kp 4000, kd 100);
an action is a target velocity: ``target += dt x 20 x action``, clamped to the joint limits.
Isaac's three force sensors sit on the tray at the legs' tops and read the tray's net force
(the same for each) and torques about those points; MuJoCo's force and torque sensors read the
force a body receives from its parent, which for a free tray is none, so here each sensor sits
on its upper leg at the hinge to the tray and reads that leg's load. Physics is MuJoCo's, with
the implicit-in-velocity integrator and 10 steps of 1 ms per env step (PhysX takes one 10 ms step;
its drives are implicit). MuJoCo's drive stiffness is explicit: at 5 ms the stiff drives and
constraints diverge, and at 2 ms saturated (bang-bang) actions still sent joint velocities to 1e10
within 200 env steps; at 1 ms they stay below 300.

Observation (float32, Isaac Gym's order, clipped to +-5)::

    [0:3]    actuated (lower leg) joint angles (rad)     [3:6]  their velocities (rad/s)
    [6:9]    ball position (m, the tray's feet centred on the origin)
    [9:12]   ball linear velocity (m/s)
    [12:15]  leg 0's force / 20;  [15:24] legs 0, 1, 2's torques / 20 (0 in a first observation)

Reward ``1 / (1 + |ball - (0, 0, 0.7)|) x 1 / (1 + |ball velocity|)``; terminated when the ball
falls below 0.15 m, truncated after 500 steps (5 s at 100 Hz).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

TRAY_RADIUS, TRAY_THICKNESS, LEG_RADIUS, BALL_RADIUS = 0.5, 0.02, 0.02, 0.1
LEG_OUTER = TRAY_RADIUS - 0.1
LEG_LENGTH = LEG_OUTER - 2 * LEG_RADIUS
LEG_INNER = LEG_OUTER - LEG_LENGTH / math.sqrt(2)
TRAY_HEIGHT = LEG_LENGTH * math.sqrt(2) + 2 * LEG_RADIUS + 0.5 * TRAY_THICKNESS
LEG_ANGLES = (0.0, 2.0 / 3.0 * math.pi, 4.0 / 3.0 * math.pi)


def _quat_zyx(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """``(w, x, y, z)`` of the rotation z(yaw) y(pitch) x(roll) (Isaac's ``from_euler_zyx``)."""
    q = np.zeros(4)
    mujoco.mju_euler2Quat(q, np.array([yaw, pitch, roll]), "ZYX")
    return q


def balance_xml(timestep: float, kp: float, kd: float) -> str:
    """The MJCF of the balance bot and its ball (see the module docstring)."""
    half = 0.5 * LEG_LENGTH
    legs, connects, actuators, sensors = [], [], [], []
    q_lower = _quat_zyx(0.0, -0.5 * math.pi, 0.0)
    for i, a in enumerate(LEG_ANGLES):
        top = np.array([LEG_OUTER * math.cos(a), LEG_OUTER * math.sin(a),
                        -LEG_RADIUS - 0.5 * TRAY_THICKNESS])
        bottom = np.array([LEG_INNER * math.cos(a), LEG_INNER * math.sin(a),
                           top[2] - LEG_LENGTH / math.sqrt(2)])
        pos, q = (top + bottom) / 2, _quat_zyx(0.0, -0.75 * math.pi, a)
        legs.append(f"""
      <body name="upper_leg{i}" pos="{pos[0]:.9g} {pos[1]:.9g} {pos[2]:.9g}"
            quat="{q[0]:.9g} {q[1]:.9g} {q[2]:.9g} {q[3]:.9g}">
        <geom type="capsule" size="{LEG_RADIUS} {half:.9g}" density="1000" class="robot"/>
        <joint name="upper_leg_joint{i}" pos="0 0 {-half:.9g}" axis="0 1 0" range="-45 45"/>
        <site name="leg{i}_load" pos="0 0 {-half:.9g}"/>
        <body name="lower_leg{i}" pos="{-half:.9g} 0 {half:.9g}"
              quat="{q_lower[0]:.9g} {q_lower[1]:.9g} {q_lower[2]:.9g} {q_lower[3]:.9g}">
          <geom type="capsule" size="{LEG_RADIUS} {half:.9g}" density="1000" class="robot"/>
          <joint name="lower_leg_joint{i}" pos="0 0 {-half:.9g}" axis="0 1 0" range="-70 90"/>
        </body>
      </body>""")
        connects.append(f'    <connect body1="lower_leg{i}" anchor="0 0 {half:.9g}"/>')
        actuators.append(f'    <position joint="lower_leg_joint{i}" kp="{kp}" kv="{kd}"/>')
        sensors.append(f'    <force site="leg{i}_load"/>\n    <torque site="leg{i}_load"/>')
    return f"""<mujoco model="balance-bot-gmi">
  <compiler angle="degree"/>
  <option timestep="{timestep}" integrator="implicitfast"/>
  <default>
    <default class="robot"><geom contype="2" conaffinity="0"/></default>
  </default>
  <worldbody>
    <geom name="floor" type="plane" size="0 0 0.05"/>
    <body name="tray" pos="0 0 {TRAY_HEIGHT:.9g}">
      <freejoint/>
      <geom type="cylinder" size="{TRAY_RADIUS} {0.5 * TRAY_THICKNESS}" density="100"
            class="robot"/>{"".join(legs)}
    </body>
    <body name="ball" pos="0.2 0 2">
      <freejoint/>
      <geom type="sphere" size="{BALL_RADIUS}" density="200" contype="1" conaffinity="3"/>
    </body>
  </worldbody>
  <equality>
{chr(10).join(connects)}
  </equality>
  <actuator>
{chr(10).join(actuators)}
  </actuator>
  <sensor>
{chr(10).join(sensors)}
  </sensor>
</mujoco>"""


@dataclass(frozen=True)
class BalanceLayout:
    """Addresses in the compiled model: the three actuated joints' qpos/qvel, their limits
    (rad), the ball's free joint qpos/qvel start, and the tray's reset pose."""

    act_qpos: np.ndarray
    act_qvel: np.ndarray
    act_lower: np.ndarray
    act_upper: np.ndarray
    ball_qpos: int
    ball_qvel: int
    root_qpos: np.ndarray


@dataclass(frozen=True)
class BalanceTask:
    """Isaac Gym's ``BallBalance`` constants (``cfg/task/BallBalance.yaml``)."""

    task_id: str = "BallBalance-gmi-v0"
    model_source: str = ("Isaac Gym's BalanceBot MJCF rebuilt in gmi_drl/envs/warp/balance.py; "
                         "feet held by connect constraints, leg-load force sensors")
    control_dt: float = 0.01
    frame_skip: int = 10
    max_episode_steps: int = 500
    action_speed_scale: float = 20.0
    kp: float = 4000.0
    kd: float = 100.0
    clip_obs: float = 5.0
    sensor_scale: float = 1.0 / 20.0
    target_height: float = 0.7
    fall_height: float = 1.5 * BALL_RADIUS
    obs_dim: int = 24
    action_dim: int = 3
    policy: tuple[int, ...] = (256, 128, 64)
    nconmax: int = 48
    njmax: int = 64
    kernels = "balance_kernels"
    state_dim = 3  # the PD targets of the three actuated joints

    def build_model(self) -> mujoco.MjModel:
        return mujoco.MjModel.from_xml_string(
            balance_xml(self.control_dt / self.frame_skip, self.kp, self.kd))

    def layout(self, model: mujoco.MjModel) -> BalanceLayout:
        joints = [model.joint(f"lower_leg_joint{i}") for i in range(3)]
        ball = model.joint(model.body("ball").jntadr[0])
        return BalanceLayout(
            act_qpos=np.array([j.qposadr[0] for j in joints], np.int32),
            act_qvel=np.array([j.dofadr[0] for j in joints], np.int32),
            act_lower=np.array([j.range[0] for j in joints], np.float32),
            act_upper=np.array([j.range[1] for j in joints], np.float32),
            ball_qpos=int(ball.qposadr[0]), ball_qvel=int(ball.dofadr[0]),
            root_qpos=model.qpos0[:7].astype(np.float32))

    def check_model(self, model: mujoco.MjModel, layout: BalanceLayout) -> None:
        if model.nu != self.action_dim or model.nsensordata != 18:
            raise ValueError(f"{self.task_id}: the model has {model.nu} actuators and "
                             f"{model.nsensordata} sensor values, not 3 and 18")


BALL_BALANCE = BalanceTask()


def reference_observation(task: BalanceTask, layout: BalanceLayout, qpos: np.ndarray,
                          qvel: np.ndarray, sensordata: np.ndarray) -> np.ndarray:
    """One world's observation in plain NumPy float64 (``compute_observations``)."""
    f = sensordata.reshape(3, 6) * task.sensor_scale
    obs = np.concatenate([qpos[layout.act_qpos], qvel[layout.act_qvel],
                          qpos[layout.ball_qpos:layout.ball_qpos + 3],
                          qvel[layout.ball_qvel:layout.ball_qvel + 3], f[0, :3],
                          f[:, 3:].ravel()])
    return np.clip(obs, -task.clip_obs, task.clip_obs)


def reference_reward(task: BalanceTask, ball_pos: np.ndarray,
                     ball_vel: np.ndarray) -> tuple[float, bool]:
    """``(reward, terminated)`` in plain NumPy (``compute_bbot_reward``)."""
    dist = math.sqrt(ball_pos[0] ** 2 + (ball_pos[2] - task.target_height) ** 2
                     + ball_pos[1] ** 2)
    speed = math.sqrt((ball_vel ** 2).sum())
    return 1.0 / (1.0 + dist) * (1.0 / (1.0 + speed)), bool(ball_pos[2] < task.fall_height)
