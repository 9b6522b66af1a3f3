"""ShadowHand's kernels: observation, reward, goal resampling, termination and same-step reset of
every world, on the device (IsaacGymEnvs ``ShadowHand``: ``compute_full_state``,
``compute_hand_reward``, ``reset_target_pose``, ``reset_idx``; `gmi_drl.envs.warp.hand` has the
task, its model and the NumPy references). One thread per world; ``Worlds.task_state`` holds
the goal orientation as (x, y, z, w). Warp's ``quat`` is (x, y, z, w); MuJoCo stores w first.
"""

from __future__ import annotations

import math

import warp as wp

from gmi_drl.envs.warp.hand import HandLayout, HandTask
from gmi_drl.envs.warp.worlds import Worlds, count, end_step, start_totals

# the pools never differentiate through a kernel: no adjoints to compile (half a module's time)
wp.set_module_options({"enable_backward": False})

BODY_STATES = True
"""the observation reads body poses and velocities (fingertips): the pool recomputes them from
the state after the physics and again after resets (`observe_reset`)"""


@wp.struct
class HandParams:
    """The task's constants and layout, as the kernels read them."""

    vel_obs_scale: wp.float32
    force_torque_obs_scale: wp.float32
    clip_obs: wp.float32
    dist_reward_scale: wp.float32
    rot_reward_scale: wp.float32
    rot_eps: wp.float32
    action_penalty_scale: wp.float32
    success_tolerance: wp.float32
    reach_goal_bonus: wp.float32
    fall_dist: wp.float32
    reset_position_noise: wp.float32
    reset_dof_pos_noise: wp.float32
    max_episode_steps: wp.int32
    object_qpos: wp.int32
    object_qvel: wp.int32
    goal_pos: wp.vec3
    dof_qpos: wp.array(dtype=wp.int32)
    dof_qvel: wp.array(dtype=wp.int32)
    dof_lower: wp.array(dtype=wp.float32)
    dof_upper: wp.array(dtype=wp.float32)
    fingertips: wp.array(dtype=wp.int32)
    fingertip_roots: wp.array(dtype=wp.int32)
    object_init: wp.array(dtype=wp.float32)


def make_params(task: HandTask, layout: HandLayout, device) -> HandParams:
    """The kernels' `HandParams` for ``task`` on a Warp ``device``."""
    p = HandParams()
    for name in ("vel_obs_scale", "force_torque_obs_scale", "clip_obs", "dist_reward_scale",
                 "rot_reward_scale", "rot_eps", "action_penalty_scale", "success_tolerance",
                 "reach_goal_bonus", "fall_dist", "reset_position_noise", "reset_dof_pos_noise"):
        setattr(p, name, float(getattr(task, name)))
    p.max_episode_steps = task.max_episode_steps
    p.object_qpos, p.object_qvel = layout.object_qpos, layout.object_qvel
    init = layout.object_init
    p.goal_pos = wp.vec3(float(init[0]), float(init[1]), float(init[2]) - task.goal_drop)
    for name in ("dof_qpos", "dof_qvel", "dof_lower", "dof_upper", "fingertips",
                 "fingertip_roots", "object_init"):
        setattr(p, name, wp.array(getattr(layout, name), device=device))
    return p


@wp.func
def _object_quat(w: int, p: HandParams, s: Worlds):
    o = p.object_qpos
    return wp.quat(s.qpos[w, o + 4], s.qpos[w, o + 5], s.qpos[w, o + 6], s.qpos[w, o + 3])


@wp.func
def _goal_quat(w: int, s: Worlds):
    return wp.quat(s.task_state[w, 0], s.task_state[w, 1], s.task_state[w, 2], s.task_state[w, 3])


@wp.func
def _put_quat(w: int, o: wp.array2d(dtype=wp.float32), k: int, q: wp.quat):
    for i in range(4):
        o[w, k + i] = q[i]


@wp.func
def _put_vec(w: int, o: wp.array2d(dtype=wp.float32), k: int, v: wp.vec3, scale: wp.float32):
    for i in range(3):
        o[w, k + i] = v[i] * scale


@wp.func
def _observe_goal(w: int, p: HandParams, s: Worlds):
    """Write the goal's part of world ``w``'s observation, [85:96]."""
    o = s.obs
    goal = _goal_quat(w, s)
    _put_vec(w, o, 85, p.goal_pos, 1.0)
    _put_quat(w, o, 88, goal)
    _put_quat(w, o, 92, wp.mul(_object_quat(w, p, s), wp.quat_inverse(goal)))
    for i in range(85, 96):
        o[w, i] = wp.clamp(o[w, i], -p.clip_obs, p.clip_obs)


@wp.func
def _observe(w: int, p: HandParams, s: Worlds, forces: wp.float32):
    """Write world ``w``'s observation (``forces`` 0 on a reset state: no forces, no actions)."""
    o = s.obs
    ndof = p.dof_qpos.shape[0]
    for j in range(ndof):
        lo = p.dof_lower[j]
        hi = p.dof_upper[j]
        o[w, j] = (2.0 * s.qpos[w, p.dof_qpos[j]] - hi - lo) / (hi - lo)
        o[w, ndof + j] = s.qvel[w, p.dof_qvel[j]] * p.vel_obs_scale
        o[w, 2 * ndof + j] = forces * s.qfrc_actuator[w, p.dof_qvel[j]] * p.force_torque_obs_scale
    q = _object_quat(w, p, s)
    op = p.object_qpos
    ov = p.object_qvel
    _put_vec(w, o, 72, wp.vec3(s.qpos[w, op], s.qpos[w, op + 1], s.qpos[w, op + 2]), 1.0)
    _put_quat(w, o, 75, q)
    _put_vec(w, o, 79, wp.vec3(s.qvel[w, ov], s.qvel[w, ov + 1], s.qvel[w, ov + 2]), 1.0)
    ang = wp.quat_rotate(q, wp.vec3(s.qvel[w, ov + 3], s.qvel[w, ov + 4], s.qvel[w, ov + 5]))
    _put_vec(w, o, 82, ang, p.vel_obs_scale)
    for f in range(p.fingertips.shape[0]):
        b = p.fingertips[f]
        k = 96 + 13 * f
        pos = s.xpos[w, b]
        xq = s.xquat[w, b]  # MuJoCo's (w, x, y, z) in Warp's quat storage
        cv = s.cvel[w, b]
        omega = wp.vec3(cv[0], cv[1], cv[2])
        lin = wp.vec3(cv[3], cv[4], cv[5]) + wp.cross(
            omega, pos - s.subtree_com[w, p.fingertip_roots[f]])
        _put_vec(w, o, k, pos, 1.0)
        _put_quat(w, o, k + 3, wp.quat(xq[1], xq[2], xq[3], xq[0]))
        _put_vec(w, o, k + 7, lin, 1.0)
        _put_vec(w, o, k + 10, omega, 1.0)
    for i in range(s.sensordata.shape[1]):
        o[w, 161 + i] = forces * s.sensordata[w, i] * p.force_torque_obs_scale
    for a in range(s.actions.shape[1]):
        o[w, 191 + a] = forces * s.actions[w, a]
    for i in range(o.shape[1]):
        o[w, i] = wp.clamp(o[w, i], -p.clip_obs, p.clip_obs)
    _observe_goal(w, p, s)


@wp.func
def _random_rotation(state: wp.uint32):
    """Isaac Gym's ``randomize_rotation``: about x by U(-pi, pi), then about y by U(-pi, pi)."""
    ax = wp.randf(state, -1.0, 1.0) * math.pi
    ay = wp.randf(state, -1.0, 1.0) * math.pi
    return wp.mul(wp.quat_from_axis_angle(wp.vec3(1.0, 0.0, 0.0), ax),
                  wp.quat_from_axis_angle(wp.vec3(0.0, 1.0, 0.0), ay))


@wp.func
def _new_goal(w: int, s: Worlds):
    state = wp.rand_init(s.seed[w], s.resets[w])
    s.resets[w] = s.resets[w] + 1
    g = _random_rotation(state)
    for i in range(4):
        s.task_state[w, i] = g[i]


@wp.func
def _start_episode(w: int, p: HandParams, s: Worlds):
    """Isaac Gym's ``reset_idx``: a new goal orientation; the block at its start position
    +- ``reset_position_noise`` per axis, in a random orientation, at rest; each hand joint at
    ``reset_dof_pos_noise`` x U(lower, upper), at rest."""
    _new_goal(w, s)
    state = wp.rand_init(s.seed[w], s.resets[w])
    s.resets[w] = s.resets[w] + 1
    for i in range(s.qvel.shape[1]):
        s.qvel[w, i] = 0.0
        s.qacc_warmstart[w, i] = 0.0
    o = p.object_qpos
    for i in range(3):
        s.qpos[w, o + i] = p.object_init[i] + p.reset_position_noise * wp.randf(state, -1.0, 1.0)
    q = _random_rotation(state)
    s.qpos[w, o + 3] = q[3]
    s.qpos[w, o + 4] = q[0]
    s.qpos[w, o + 5] = q[1]
    s.qpos[w, o + 6] = q[2]
    for j in range(p.dof_qpos.shape[0]):
        s.qpos[w, p.dof_qpos[j]] = p.reset_dof_pos_noise * wp.randf(state, p.dof_lower[j],
                                                                     p.dof_upper[j])
    _observe(w, p, s, 0.0)
    start_totals(w, s)


@wp.kernel
def finish_step(p: HandParams, s: Worlds):
    """After the physics substeps of one env step, per world: observation, reward, a new goal
    where this one was reached, termination when the block was dropped, truncation, totals and
    the same-step reset of ended worlds."""
    w = wp.tid()
    _observe(w, p, s, 1.0)
    o = p.object_qpos
    goal_dist = wp.length(wp.vec3(s.qpos[w, o], s.qpos[w, o + 1], s.qpos[w, o + 2]) - p.goal_pos)
    diff = wp.mul(_object_quat(w, p, s), wp.quat_inverse(_goal_quat(w, s)))
    rot_dist = 2.0 * wp.asin(wp.min(wp.length(wp.vec3(diff[0], diff[1], diff[2])), 1.0))
    penalty = float(0.0)
    for a in range(s.actions.shape[1]):
        penalty += s.actions[w, a] * s.actions[w, a]
    r = (goal_dist * p.dist_reward_scale + 1.0 / (wp.abs(rot_dist) + p.rot_eps)
         * p.rot_reward_scale + penalty * p.action_penalty_scale)
    reached = wp.abs(rot_dist) <= p.success_tolerance
    if reached:
        r = r + p.reach_goal_bonus
        count(w, s, 1.0)  # a success (Isaac Gym's ``successes``)
    fell = goal_dist >= p.fall_dist
    if end_step(w, s, r, p.max_episode_steps, fell):
        _start_episode(w, p, s)
    elif reached:
        _new_goal(w, s)
        _observe_goal(w, p, s)


@wp.kernel
def observe_reset(p: HandParams, s: Worlds):
    """Observe again each world whose episode started this step, once the pool recomputed the
    body poses and velocities of its new state (`BODY_STATES`)."""
    w = wp.tid()
    if s.running_length[w] == 0:
        _observe(w, p, s, 0.0)


@wp.kernel
def reset_worlds(p: HandParams, s: Worlds, mask: wp.array(dtype=wp.int32)):
    """Start a new episode in every world where ``mask`` is non-zero (`reset`)."""
    w = wp.tid()
    if mask[w] != 0:
        _start_episode(w, p, s)
