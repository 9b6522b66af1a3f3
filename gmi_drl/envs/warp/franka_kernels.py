"""FrankaCabinet's kernels: relative PD targets, observation, reward, termination and same-step
reset of every world, on the device (IsaacGymEnvs ``FrankaCabinet``: ``pre_physics_step``,
``compute_observations``, ``compute_franka_reward``, ``reset_idx``; `gmi_drl.envs.warp.franka`
has the task, its model and the NumPy references). One thread per world;
``Worlds.task_state`` holds the nine PD targets. MuJoCo Warp keeps MuJoCo's quaternions (w
first) in Warp's ``quat`` storage; `_rotate` and `_mul` work in that order.
"""

from __future__ import annotations

import warp as wp

from gmi_drl.envs.warp.franka import (DEFAULT_DOF_POS, DRAWER_GRASP, GRASP_IN_LINK7,
                                      GRASP_ROT_IN_LINK7, FrankaLayout, FrankaTask)
from gmi_drl.envs.warp.worlds import Worlds, end_step, start_totals

# the pools never differentiate through a kernel: no adjoints to compile (half a module's time)
wp.set_module_options({"enable_backward": False})

BODY_STATES = True
"""the observation reads body poses (gripper and drawer grasp frames)"""


@wp.struct
class FrankaParams:
    """The task's constants and layout, as the kernels read them."""

    target_step: wp.float32  # dt x action_scale (x speed scale per joint below)
    dof_vel_scale: wp.float32
    dist_reward_scale: wp.float32
    rot_reward_scale: wp.float32
    around_handle_reward_scale: wp.float32
    open_reward_scale: wp.float32
    finger_dist_reward_scale: wp.float32
    action_penalty_scale: wp.float32
    dist_x_offset: wp.float32
    open_distance: wp.float32
    clip_obs: wp.float32
    max_episode_steps: wp.int32
    drawer_qpos: wp.int32
    drawer_qvel: wp.int32
    hand: wp.int32
    lfinger: wp.int32
    rfinger: wp.int32
    drawer: wp.int32
    grasp_pos: wp.vec3
    grasp_rot: wp.quat  # w first, as MuJoCo
    drawer_grasp: wp.vec3
    dof_qpos: wp.array(dtype=wp.int32)
    dof_qvel: wp.array(dtype=wp.int32)
    dof_lower: wp.array(dtype=wp.float32)
    dof_upper: wp.array(dtype=wp.float32)
    speed: wp.array(dtype=wp.float32)
    default_pos: wp.array(dtype=wp.float32)


def make_params(task: FrankaTask, layout: FrankaLayout, device) -> FrankaParams:
    """The kernels' `FrankaParams` for ``task`` on a Warp ``device``."""
    import numpy as np

    p = FrankaParams()
    p.target_step = task.control_dt * task.action_scale
    for name in ("dof_vel_scale", "dist_reward_scale", "rot_reward_scale",
                 "around_handle_reward_scale", "open_reward_scale", "finger_dist_reward_scale",
                 "action_penalty_scale", "dist_x_offset", "open_distance", "clip_obs"):
        setattr(p, name, float(getattr(task, name)))
    p.max_episode_steps = task.max_episode_steps
    for name in ("drawer_qpos", "drawer_qvel", "hand", "lfinger", "rfinger", "drawer"):
        setattr(p, name, int(getattr(layout, name)))
    p.grasp_pos, p.grasp_rot = wp.vec3(*GRASP_IN_LINK7), wp.quat(*GRASP_ROT_IN_LINK7)
    p.drawer_grasp = wp.vec3(*DRAWER_GRASP)
    for name in ("dof_qpos", "dof_qvel", "dof_lower", "dof_upper"):
        setattr(p, name, wp.array(getattr(layout, name), device=device))
    p.speed = wp.array(np.array([1.0] * 7 + [0.1] * 2, np.float32), device=device)
    p.default_pos = wp.array(np.array(DEFAULT_DOF_POS, np.float32), device=device)
    return p


@wp.kernel
def apply_actions(p: FrankaParams, s: Worlds, actions_in: wp.array2d(dtype=wp.float32),
                  ctrl: wp.array2d(dtype=wp.float32)):
    """Relative control: ``target += speed x dt x action_scale x clip(action)``, clamped to the
    joint's limits; the position actuator's control is the target."""
    w, a = wp.tid()
    x = wp.clamp(actions_in[w, a], -1.0, 1.0)
    s.actions[w, a] = x
    target = wp.clamp(s.task_state[w, a] + p.speed[a] * p.target_step * x, p.dof_lower[a],
                      p.dof_upper[a])
    s.task_state[w, a] = target
    ctrl[w, a] = target


@wp.func
def _mul(a: wp.quat, b: wp.quat):
    """Hamilton product of w-first quaternions."""
    return wp.quat(a[0] * b[0] - a[1] * b[1] - a[2] * b[2] - a[3] * b[3],
                   a[0] * b[1] + a[1] * b[0] + a[2] * b[3] - a[3] * b[2],
                   a[0] * b[2] - a[1] * b[3] + a[2] * b[0] + a[3] * b[1],
                   a[0] * b[3] + a[1] * b[2] - a[2] * b[1] + a[3] * b[0])


@wp.func
def _rotate(v: wp.vec3, q: wp.quat):
    """``v`` rotated by the w-first unit quaternion ``q``."""
    u = wp.vec3(q[1], q[2], q[3])
    return v * (2.0 * q[0] * q[0] - 1.0) + wp.cross(u, v) * (2.0 * q[0]) + u * (2.0 * wp.dot(u, v))


@wp.func
def _frames(w: int, p: FrankaParams, s: Worlds):
    """``(gripper pos, gripper quat, drawer grasp pos, drawer quat)``, quaternions w first."""
    hq = s.xquat[w, p.hand]
    dq = s.xquat[w, p.drawer]
    gpos = s.xpos[w, p.hand] + _rotate(p.grasp_pos, hq)
    grot = _mul(hq, p.grasp_rot)
    dpos = s.xpos[w, p.drawer] + _rotate(p.drawer_grasp, dq)
    return gpos, grot, dpos, dq


@wp.func
def _observe(w: int, p: FrankaParams, s: Worlds):
    """Write world ``w``'s observation (all from the state: the same on a reset state)."""
    o = s.obs
    for j in range(9):
        lo = p.dof_lower[j]
        hi = p.dof_upper[j]
        o[w, j] = 2.0 * (s.qpos[w, p.dof_qpos[j]] - lo) / (hi - lo) - 1.0
        o[w, 9 + j] = s.qvel[w, p.dof_qvel[j]] * p.dof_vel_scale
    gpos, grot, dpos, dq = _frames(w, p, s)
    to_target = dpos - gpos
    for i in range(3):
        o[w, 18 + i] = to_target[i]
    o[w, 21] = s.qpos[w, p.drawer_qpos]
    o[w, 22] = s.qvel[w, p.drawer_qvel]
    for i in range(o.shape[1]):
        o[w, i] = wp.clamp(o[w, i], -p.clip_obs, p.clip_obs)


@wp.func
def _signed_square(x: wp.float32):
    return wp.sign(x) * x * x


@wp.func
def _reward(w: int, p: FrankaParams, s: Worlds):
    gpos, grot, dpos, dq = _frames(w, p, s)
    d = wp.length(gpos - dpos)
    dist = 1.0 / (1.0 + d * d)
    dist = dist * dist
    if d <= 0.02:
        dist = dist * 2.0
    dot1 = wp.dot(_rotate(wp.vec3(0.0, 0.0, 1.0), grot),
                  _rotate(wp.vec3(-1.0, 0.0, 0.0), dq))
    dot2 = wp.dot(_rotate(wp.vec3(0.0, 1.0, 0.0), grot),
                  _rotate(wp.vec3(0.0, 0.0, 1.0), dq))
    rot = 0.5 * (_signed_square(dot1) + _signed_square(dot2))
    lf = s.xpos[w, p.lfinger]
    rf = s.xpos[w, p.rfinger]
    around = float(0.0)
    finger = float(0.0)
    if lf[2] > dpos[2] and rf[2] < dpos[2]:
        around = 0.5
        finger = (0.04 - wp.abs(lf[2] - dpos[2])) + (0.04 - wp.abs(rf[2] - dpos[2]))
    penalty = float(0.0)
    for a in range(s.actions.shape[1]):
        penalty += s.actions[w, a] * s.actions[w, a]
    opening = s.qpos[w, p.drawer_qpos]
    r = (p.dist_reward_scale * dist + p.rot_reward_scale * rot
         + p.around_handle_reward_scale * around
         + p.open_reward_scale * (opening * around + opening)
         + p.finger_dist_reward_scale * finger - p.action_penalty_scale * penalty)
    if opening > 0.01:
        r = r + 0.5
    if opening > 0.2:
        r = r + around
    if opening > 0.39:
        r = r + 2.0 * around
    if lf[0] < dpos[0] - p.dist_x_offset or rf[0] < dpos[0] - p.dist_x_offset:
        r = -1.0
    return r


@wp.func
def _start_episode(w: int, p: FrankaParams, s: Worlds):
    """Isaac Gym's ``reset_idx``: each joint at its default + 0.25 x U(-0.5, 0.5), clamped to
    its limits, at rest and as its PD target; the drawer closed and at rest."""
    state = wp.rand_init(s.seed[w], s.resets[w])
    s.resets[w] = s.resets[w] + 1
    for i in range(s.qvel.shape[1]):
        s.qvel[w, i] = 0.0
        s.qacc_warmstart[w, i] = 0.0
    for j in range(9):
        q = wp.clamp(p.default_pos[j] + 0.25 * (wp.randf(state) - 0.5), p.dof_lower[j],
                     p.dof_upper[j])
        s.qpos[w, p.dof_qpos[j]] = q
        s.task_state[w, j] = q
    s.qpos[w, p.drawer_qpos] = 0.0
    _observe(w, p, s)
    start_totals(w, s)


@wp.kernel
def finish_step(p: FrankaParams, s: Worlds):
    """After the physics substeps of one env step, per world: observation, reward, termination
    once the drawer is open, truncation, totals and the same-step reset of ended worlds."""
    w = wp.tid()
    _observe(w, p, s)
    r = _reward(w, p, s)
    opened = s.qpos[w, p.drawer_qpos] > p.open_distance
    if end_step(w, s, r, p.max_episode_steps, opened):
        _start_episode(w, p, s)


@wp.kernel
def observe_reset(p: FrankaParams, s: Worlds):
    """Observe again each world whose episode started this step, from its new body poses."""
    w = wp.tid()
    if s.running_length[w] == 0:
        _observe(w, p, s)


@wp.kernel
def reset_worlds(p: FrankaParams, s: Worlds, mask: wp.array(dtype=wp.int32)):
    """Start a new episode in every world where ``mask`` is non-zero (`reset`)."""
    w = wp.tid()
    if mask[w] != 0:
        _start_episode(w, p, s)
