"""BallBalance's kernels: action integration into PD targets, observation, reward, termination
and same-step reset of every world, on the device (IsaacGymEnvs ``BallBalance``:
``pre_physics_step``, ``compute_observations``, ``compute_bbot_reward``, ``reset_idx``;
`gmi_drl.envs.warp.balance` has the task, its model and the NumPy references). One thread per
world; ``Worlds.task_state`` holds the three PD targets.
"""

from __future__ import annotations

import math

import warp as wp

from gmi_drl.envs.warp.balance import BalanceLayout, BalanceTask
from gmi_drl.envs.warp.worlds import Worlds, end_step, start_totals

# the pools never differentiate through a kernel: no adjoints to compile (half a module's time)
wp.set_module_options({"enable_backward": False})


@wp.struct
class BalanceParams:
    """The task's constants and layout, as the kernels read them."""

    target_step: wp.float32  # dt x action_speed_scale: rad of target per unit action
    clip_obs: wp.float32
    sensor_scale: wp.float32
    target_height: wp.float32
    fall_height: wp.float32
    max_episode_steps: wp.int32
    ball_qpos: wp.int32
    ball_qvel: wp.int32
    act_qpos: wp.array(dtype=wp.int32)
    act_qvel: wp.array(dtype=wp.int32)
    act_lower: wp.array(dtype=wp.float32)
    act_upper: wp.array(dtype=wp.float32)
    root_qpos: wp.array(dtype=wp.float32)


def make_params(task: BalanceTask, layout: BalanceLayout, device) -> BalanceParams:
    """The kernels' `BalanceParams` for ``task`` on a Warp ``device``."""
    p = BalanceParams()
    p.target_step = task.control_dt * task.action_speed_scale
    p.clip_obs, p.sensor_scale = task.clip_obs, task.sensor_scale
    p.target_height, p.fall_height = task.target_height, task.fall_height
    p.max_episode_steps = task.max_episode_steps
    p.ball_qpos, p.ball_qvel = layout.ball_qpos, layout.ball_qvel
    for name in ("act_qpos", "act_qvel", "act_lower", "act_upper", "root_qpos"):
        setattr(p, name, wp.array(getattr(layout, name), device=device))
    return p


@wp.kernel
def apply_actions(p: BalanceParams, s: Worlds, actions_in: wp.array2d(dtype=wp.float32),
                  ctrl: wp.array2d(dtype=wp.float32)):
    """An action is a target velocity: ``target += dt x 20 x clip(action)``, clamped to the
    joint's limits; the PD drive's control is the target."""
    w, a = wp.tid()
    x = wp.clamp(actions_in[w, a], -1.0, 1.0)
    s.actions[w, a] = x
    target = wp.clamp(s.task_state[w, a] + p.target_step * x, p.act_lower[a], p.act_upper[a])
    s.task_state[w, a] = target
    ctrl[w, a] = target


@wp.func
def _observe(w: int, p: BalanceParams, s: Worlds, forces: wp.float32):
    """Write world ``w``'s observation (``forces`` 0 on a reset state: sensors not yet read)."""
    o = s.obs
    for j in range(3):
        o[w, j] = s.qpos[w, p.act_qpos[j]]
        o[w, 3 + j] = s.qvel[w, p.act_qvel[j]]
        o[w, 6 + j] = s.qpos[w, p.ball_qpos + j]
        o[w, 9 + j] = s.qvel[w, p.ball_qvel + j]
        o[w, 12 + j] = forces * s.sensordata[w, j] * p.sensor_scale  # leg 0's force
        for leg in range(3):  # each leg's torque
            o[w, 15 + 3 * leg + j] = forces * s.sensordata[w, 6 * leg + 3 + j] * p.sensor_scale
    for i in range(o.shape[1]):
        o[w, i] = wp.clamp(o[w, i], -p.clip_obs, p.clip_obs)


@wp.func
def _start_episode(w: int, p: BalanceParams, s: Worlds):
    """Isaac Gym's ``reset_idx``: the bot at rest in its initial pose with targets 0; the ball
    at a random horizontal offset U(0.001, 0.5) m in a random direction, at height U(1, 2) m,
    moving back towards the centre at up to 5 m/s (faster the farther out) and down at 5 m/s."""
    state = wp.rand_init(s.seed[w], s.resets[w])
    s.resets[w] = s.resets[w] + 1
    for i in range(s.qpos.shape[1]):
        s.qpos[w, i] = 0.0
    for i in range(s.qvel.shape[1]):
        s.qvel[w, i] = 0.0
        s.qacc_warmstart[w, i] = 0.0
    for i in range(7):
        s.qpos[w, i] = p.root_qpos[i]
    for j in range(3):
        s.task_state[w, j] = 0.0
    dist = wp.randf(state, 0.001, 0.5)
    angle = wp.randf(state, 0.0, 2.0 * math.pi)
    speed = (dist - 0.001) / (0.5 - 0.001) * wp.randf(state, 0.0, 5.0)
    b = p.ball_qpos
    s.qpos[w, b] = dist * wp.cos(angle)
    s.qpos[w, b + 1] = dist * wp.sin(angle)
    s.qpos[w, b + 2] = wp.randf(state, 1.0, 2.0)
    s.qpos[w, b + 3] = 1.0  # identity orientation (w first)
    v = p.ball_qvel
    s.qvel[w, v] = -speed * wp.cos(angle)
    s.qvel[w, v + 1] = -speed * wp.sin(angle)
    s.qvel[w, v + 2] = -5.0
    _observe(w, p, s, 0.0)
    start_totals(w, s)


@wp.kernel
def finish_step(p: BalanceParams, s: Worlds):
    """After the physics substeps of one env step, per world: observation, reward
    ``1 / (1 + distance to (0, 0, 0.7)) x 1 / (1 + speed)`` of the ball, termination when it
    fell below ``fall_height``, truncation, totals and the same-step reset of ended worlds."""
    w = wp.tid()
    _observe(w, p, s, 1.0)
    b = p.ball_qpos
    x = s.qpos[w, b]
    y = s.qpos[w, b + 1]
    z = s.qpos[w, b + 2]
    v = p.ball_qvel
    vx = s.qvel[w, v]
    vy = s.qvel[w, v + 1]
    vz = s.qvel[w, v + 2]
    dist = wp.sqrt(x * x + (z - p.target_height) * (z - p.target_height) + y * y)
    speed = wp.sqrt(vx * vx + vy * vy + vz * vz)
    r = 1.0 / (1.0 + dist) * (1.0 / (1.0 + speed))
    fell = z < p.fall_height
    if end_step(w, s, r, p.max_episode_steps, fell):
        _start_episode(w, p, s)


@wp.kernel
def reset_worlds(p: BalanceParams, s: Worlds, mask: wp.array(dtype=wp.int32)):
    """Start a new episode in every world where ``mask`` is non-zero (`reset`)."""
    w = wp.tid()
    if mask[w] != 0:
        _start_episode(w, p, s)
