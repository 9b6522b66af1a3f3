"""Ant's and Humanoid's kernels: observation, reward, termination and same-step reset of every
world, on the device (Isaac Gym's ``compute_*_observations``, ``compute_*_reward`` and
``reset_idx``; `gmi_drl.envs.warp.locomotion` has the tasks, their constants and the NumPy
references the tests compare with). One thread per world.
"""

from __future__ import annotations

import warp as wp

from gmi_drl.envs.warp.locomotion import TARGET, LocomotionTask, ModelLayout
from gmi_drl.envs.warp.worlds import Worlds, end_step, start_totals

# the pools never differentiate through a kernel: no adjoints to compile (half a module's time)
wp.set_module_options({"enable_backward": False})


@wp.struct
class LocomotionParams:
    """The task's constants and layout, as the kernel reads them."""

    dt: wp.float32
    target: wp.vec3
    dof_force_obs: wp.int32
    dof_vel_scale: wp.float32
    angular_velocity_scale: wp.float32
    contact_force_scale: wp.float32
    heading_weight: wp.float32
    up_weight: wp.float32
    actions_cost: wp.float32
    energy_cost: wp.float32
    joints_at_limit_cost: wp.float32
    limit_cost: wp.int32
    alive_reward: wp.float32
    death_cost: wp.float32
    termination_height: wp.float32
    max_episode_steps: wp.int32
    dof_qpos: wp.array(dtype=wp.int32)
    dof_qvel: wp.array(dtype=wp.int32)
    dof_lower: wp.array(dtype=wp.float32)
    dof_upper: wp.array(dtype=wp.float32)
    dof_initial: wp.array(dtype=wp.float32)
    act_dof: wp.array(dtype=wp.int32)
    act_effort: wp.array(dtype=wp.float32)
    dof_effort: wp.array(dtype=wp.float32)
    root_qpos: wp.array(dtype=wp.float32)


def make_params(task: LocomotionTask, layout: ModelLayout, device) -> LocomotionParams:
    """The kernel's `LocomotionParams` for ``task`` on a Warp ``device``."""
    p = LocomotionParams()
    p.dt = task.control_dt
    p.target = wp.vec3(*TARGET)
    p.dof_force_obs = int(task.dof_force_obs)
    for name in ("dof_vel_scale", "angular_velocity_scale", "contact_force_scale",
                 "heading_weight", "up_weight", "actions_cost", "energy_cost",
                 "joints_at_limit_cost", "alive_reward", "death_cost", "termination_height"):
        setattr(p, name, float(getattr(task, name)))
    p.limit_cost = task.limit_cost
    p.max_episode_steps = task.max_episode_steps
    for name in ("dof_qpos", "dof_qvel", "dof_lower", "dof_upper", "dof_initial", "act_dof",
                 "act_effort", "dof_effort", "root_qpos"):
        setattr(p, name, wp.array(getattr(layout, name), device=device))
    return p


@wp.func
def _normalize_angle(x: wp.float32):
    return wp.atan2(wp.sin(x), wp.cos(x))


@wp.func
def _observe(w: int, p: LocomotionParams, qpos: wp.array2d(dtype=wp.float32),
             qvel: wp.array2d(dtype=wp.float32), sensordata: wp.array2d(dtype=wp.float32),
             qfrc_actuator: wp.array2d(dtype=wp.float32), actions: wp.array2d(dtype=wp.float32),
             forces: wp.float32, obs: wp.array2d(dtype=wp.float32),
             potentials: wp.array(dtype=wp.float64)):
    """Write world ``w``'s observation; return ``(up_proj, heading_proj)`` via obs[10], obs[11].

    ``forces`` is 1 after a physics step and 0 on a reset state (force, sensor, action terms 0).
    Updates ``potentials[w]`` to ``-|to_target| / dt``.
    """
    pos = wp.vec3(qpos[w, 0], qpos[w, 1], qpos[w, 2])
    quat = wp.quat(qpos[w, 4], qpos[w, 5], qpos[w, 6], qpos[w, 3])  # MuJoCo stores w first
    vel_world = wp.vec3(qvel[w, 0], qvel[w, 1], qvel[w, 2])
    angvel_local = wp.vec3(qvel[w, 3], qvel[w, 4], qvel[w, 5])  # free joint: body frame
    to_target = p.target - pos
    to_target = wp.vec3(to_target[0], to_target[1], 0.0)
    dx = wp.float64(p.target[0]) - wp.float64(pos[0])  # float64: the potential is ~6e4
    dy = wp.float64(p.target[1]) - wp.float64(pos[1])  # and its change this step ~1
    potentials[w] = -wp.sqrt(dx * dx + dy * dy) / wp.float64(p.dt)
    up_vec = wp.quat_rotate(quat, wp.vec3(0.0, 0.0, 1.0))
    heading_vec = wp.quat_rotate(quat, wp.vec3(1.0, 0.0, 0.0))
    target_dir = to_target / wp.max(wp.length(to_target), 1.0e-9)
    vel_loc = wp.quat_rotate_inv(quat, vel_world)
    x = quat[0]
    y = quat[1]
    z = quat[2]
    qw = quat[3]
    roll = wp.atan2(2.0 * (qw * x + y * z), qw * qw - x * x - y * y + z * z)
    yaw = wp.atan2(2.0 * (qw * z + x * y), qw * qw + x * x - y * y - z * z)
    walk_target_angle = wp.atan2(p.target[2] - pos[2], p.target[0] - pos[0])
    obs[w, 0] = pos[2]
    for i in range(3):
        obs[w, 1 + i] = vel_loc[i]
        obs[w, 4 + i] = angvel_local[i] * p.angular_velocity_scale
    obs[w, 7] = yaw
    obs[w, 8] = roll
    obs[w, 9] = _normalize_angle(walk_target_angle - yaw)
    obs[w, 10] = up_vec[2]
    obs[w, 11] = wp.dot(heading_vec, target_dir)
    ndof = p.dof_qpos.shape[0]
    k = int(12)
    for j in range(ndof):
        lo = p.dof_lower[j]
        hi = p.dof_upper[j]
        obs[w, k + j] = (2.0 * qpos[w, p.dof_qpos[j]] - hi - lo) / (hi - lo)
        obs[w, k + ndof + j] = qvel[w, p.dof_qvel[j]] * p.dof_vel_scale
    k = k + 2 * ndof
    if p.dof_force_obs != 0:
        for j in range(ndof):
            obs[w, k + j] = forces * qfrc_actuator[w, p.dof_qvel[j]] * p.contact_force_scale
        k = k + ndof
    for s in range(sensordata.shape[1]):
        obs[w, k + s] = forces * sensordata[w, s] * p.contact_force_scale
    k = k + sensordata.shape[1]
    for a in range(actions.shape[1]):
        obs[w, k + a] = forces * actions[w, a]


@wp.func
def _reward(w: int, p: LocomotionParams, obs: wp.array2d(dtype=wp.float32),
            actions: wp.array2d(dtype=wp.float32), progress: wp.float32):
    """Isaac Gym's reward of world ``w`` before the fall check (``progress``: the potential's
    change this step)."""
    heading = obs[w, 11]
    heading_reward = p.heading_weight
    if heading <= 0.8:
        heading_reward = p.heading_weight * heading / 0.8
    up_reward = float(0.0)
    if obs[w, 10] > 0.93:
        up_reward = p.up_weight
    ndof = p.dof_qpos.shape[0]
    actions_cost = float(0.0)
    electricity = float(0.0)
    for a in range(actions.shape[1]):
        act = actions[w, a]
        actions_cost += act * act
        vel = obs[w, 12 + ndof + p.act_dof[a]]
        if p.limit_cost == 0:
            electricity += wp.abs(act * vel)
        else:
            electricity += wp.abs(act * vel) * p.act_effort[a]
    limit = float(0.0)
    for j in range(ndof):
        s = obs[w, 12 + j]
        if p.limit_cost == 0:
            if s > 0.99:
                limit += p.joints_at_limit_cost
        else:
            if wp.abs(s) > 0.98:
                limit += p.joints_at_limit_cost * (wp.abs(s) - 0.98) / 0.02 * p.dof_effort[j]
    return (progress + p.alive_reward + up_reward + heading_reward
            - p.actions_cost * actions_cost - p.energy_cost * electricity - limit)


@wp.func
def _reset_world(w: int, p: LocomotionParams, seed: wp.array(dtype=wp.int32),
                 resets: wp.array(dtype=wp.int32), qpos: wp.array2d(dtype=wp.float32),
                 qvel: wp.array2d(dtype=wp.float32),
                 qacc_warmstart: wp.array2d(dtype=wp.float32)):
    """Put world ``w`` in a new episode's start state (Isaac Gym's ``reset_idx``): the root at
    its initial pose at rest, each joint at its initial angle + U(-0.2, 0.2) clamped into its
    limits, with velocity U(-0.1, 0.1). Draws from a counter-based generator keyed by the
    world's seed and its number of resets, so a world's episodes do not depend on the others."""
    state = wp.rand_init(seed[w], resets[w])
    resets[w] = resets[w] + 1
    for i in range(7):
        qpos[w, i] = p.root_qpos[i]
    for i in range(qvel.shape[1]):
        qvel[w, i] = 0.0
        qacc_warmstart[w, i] = 0.0
    for j in range(p.dof_qpos.shape[0]):
        angle = p.dof_initial[j] + wp.randf(state, -0.2, 0.2)
        qpos[w, p.dof_qpos[j]] = wp.clamp(angle, p.dof_lower[j], p.dof_upper[j])
        qvel[w, p.dof_qvel[j]] = wp.randf(state, -0.1, 0.1)


@wp.func
def _start_episode(w: int, p: LocomotionParams, s: Worlds):
    """Reset world ``w``, write its first observation and zero its running episode totals."""
    _reset_world(w, p, s.seed, s.resets, s.qpos, s.qvel, s.qacc_warmstart)
    _observe(w, p, s.qpos, s.qvel, s.sensordata, s.qfrc_actuator, s.actions, 0.0, s.obs,
             s.potentials)
    start_totals(w, s)


@wp.kernel
def finish_step(p: LocomotionParams, s: Worlds):
    """After the physics substeps of one env step, per world: observation, reward, termination
    (torso below ``termination_height``: reward = ``death_cost``), truncation (time limit),
    episode totals, and the same-step reset of ended worlds, whose last observation goes to
    ``final_obs`` and whose first new observation to ``obs``."""
    w = wp.tid()
    prev = s.potentials[w]
    _observe(w, p, s.qpos, s.qvel, s.sensordata, s.qfrc_actuator, s.actions, 1.0, s.obs,
             s.potentials)
    r = _reward(w, p, s.obs, s.actions, wp.float32(s.potentials[w] - prev))
    fell = s.obs[w, 0] < p.termination_height
    if fell:
        r = p.death_cost
    if end_step(w, s, r, p.max_episode_steps, fell):
        _start_episode(w, p, s)


@wp.kernel
def reset_worlds(p: LocomotionParams, s: Worlds, mask: wp.array(dtype=wp.int32)):
    """Start a new episode in every world where ``mask`` is non-zero (`reset`)."""
    w = wp.tid()
    if mask[w] != 0:
        _start_episode(w, p, s)
