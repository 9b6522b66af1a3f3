"""Anymal's kernels: observation, reward, termination and same-step reset of every world, on the
device (Isaac Gym's ``compute_anymal_observations``, ``compute_anymal_reward`` and
``reset_idx``; `gmi_drl.envs.warp.quadruped` has the task, its model and the NumPy references
the tests compare with). One thread per world; ``Worlds.task_state`` holds each world's command.
"""

from __future__ import annotations

import warp as wp

from gmi_drl.envs.warp.locomotion import ModelLayout
from gmi_drl.envs.warp.quadruped import QuadrupedTask
from gmi_drl.envs.warp.worlds import Worlds, end_step, start_totals

# the pools never differentiate through a kernel: no adjoints to compile (half a module's time)
wp.set_module_options({"enable_backward": False})


@wp.struct
class QuadrupedParams:
    """The task's constants and layout, as the kernel reads them (reward scales times dt)."""

    lin_vel_scale: wp.float32
    ang_vel_scale: wp.float32
    dof_pos_scale: wp.float32
    dof_vel_scale: wp.float32
    rew_lin_vel_xy: wp.float32
    rew_ang_vel_z: wp.float32
    rew_torque: wp.float32
    clip_obs: wp.float32
    contact_threshold: wp.float32
    max_episode_steps: wp.int32
    command_low: wp.vec3
    command_high: wp.vec3
    root_qpos: wp.array(dtype=wp.float32)
    dof_qpos: wp.array(dtype=wp.int32)
    dof_qvel: wp.array(dtype=wp.int32)
    dof_initial: wp.array(dtype=wp.float32)


def make_params(task: QuadrupedTask, layout: ModelLayout, device) -> QuadrupedParams:
    """The kernel's `QuadrupedParams` for ``task`` on a Warp ``device``."""
    p = QuadrupedParams()
    for name in ("lin_vel_scale", "ang_vel_scale", "dof_pos_scale", "dof_vel_scale",
                 "clip_obs", "contact_threshold"):
        setattr(p, name, float(getattr(task, name)))
    for name in ("rew_lin_vel_xy", "rew_ang_vel_z", "rew_torque"):
        setattr(p, name, float(getattr(task, name)) * task.control_dt)
    p.max_episode_steps = task.max_episode_steps
    p.command_low = wp.vec3(*(lo for lo, _ in task.commands))
    p.command_high = wp.vec3(*(hi for _, hi in task.commands))
    for name in ("root_qpos", "dof_qpos", "dof_qvel", "dof_initial"):
        setattr(p, name, wp.array(getattr(layout, name), device=device))
    return p


@wp.func
def _base(w: int, s: Worlds):
    """``(quat, base-frame linear velocity)`` of world ``w``'s base (MuJoCo stores w first)."""
    quat = wp.quat(s.qpos[w, 4], s.qpos[w, 5], s.qpos[w, 6], s.qpos[w, 3])
    lin = wp.quat_rotate_inv(quat, wp.vec3(s.qvel[w, 0], s.qvel[w, 1], s.qvel[w, 2]))
    return quat, lin


@wp.func
def _observe(w: int, p: QuadrupedParams, s: Worlds, forces: wp.float32):
    """Write world ``w``'s observation (``forces`` 0 on a reset state: no actions yet)."""
    quat, lin = _base(w, s)
    gravity = wp.quat_rotate(quat, wp.vec3(0.0, 0.0, -1.0))
    o = s.obs
    for i in range(3):
        o[w, i] = lin[i] * p.lin_vel_scale
        o[w, 3 + i] = s.qvel[w, 3 + i] * p.ang_vel_scale  # free joint: base frame already
        o[w, 6 + i] = gravity[i]
    o[w, 9] = s.task_state[w, 0] * p.lin_vel_scale
    o[w, 10] = s.task_state[w, 1] * p.lin_vel_scale
    o[w, 11] = s.task_state[w, 2] * p.ang_vel_scale
    ndof = p.dof_qpos.shape[0]
    for j in range(ndof):
        o[w, 12 + j] = (s.qpos[w, p.dof_qpos[j]] - p.dof_initial[j]) * p.dof_pos_scale
        o[w, 12 + ndof + j] = s.qvel[w, p.dof_qvel[j]] * p.dof_vel_scale
    for a in range(s.actions.shape[1]):
        o[w, 12 + 2 * ndof + a] = forces * s.actions[w, a]
    for i in range(o.shape[1]):
        o[w, i] = wp.clamp(o[w, i], -p.clip_obs, p.clip_obs)


@wp.func
def _start_episode(w: int, p: QuadrupedParams, s: Worlds):
    """Isaac Gym's ``reset_idx``: the base at its initial pose at rest, joints at default x
    U(0.5, 1.5) with velocity U(-0.1, 0.1), a new command U(low, high); then the first
    observation and zeroed totals. Draws from the world's seed and its count of resets."""
    state = wp.rand_init(s.seed[w], s.resets[w])
    s.resets[w] = s.resets[w] + 1
    for i in range(7):
        s.qpos[w, i] = p.root_qpos[i]
    for i in range(s.qvel.shape[1]):
        s.qvel[w, i] = 0.0
        s.qacc_warmstart[w, i] = 0.0
    for j in range(p.dof_qpos.shape[0]):
        s.qpos[w, p.dof_qpos[j]] = p.dof_initial[j] * wp.randf(state, 0.5, 1.5)
        s.qvel[w, p.dof_qvel[j]] = wp.randf(state, -0.1, 0.1)
    for i in range(3):
        s.task_state[w, i] = wp.randf(state, p.command_low[i], p.command_high[i])
    _observe(w, p, s, 0.0)
    start_totals(w, s)


@wp.kernel
def finish_step(p: QuadrupedParams, s: Worlds):
    """After the physics substeps of one env step, per world: observation, the velocity
    tracking reward (clipped at 0), termination on base or thigh contact, truncation, totals
    and the same-step reset of ended worlds (last observation to ``final_obs``)."""
    w = wp.tid()
    _observe(w, p, s, 1.0)
    quat, lin = _base(w, s)
    ex = s.task_state[w, 0] - lin[0]
    ey = s.task_state[w, 1] - lin[1]
    ez = s.task_state[w, 2] - s.qvel[w, 5]
    torque = float(0.0)
    for j in range(p.dof_qvel.shape[0]):
        f = s.qfrc_actuator[w, p.dof_qvel[j]]
        torque += f * f
    r = (wp.exp(-(ex * ex + ey * ey) / 0.25) * p.rew_lin_vel_xy
         + wp.exp(-(ez * ez) / 0.25) * p.rew_ang_vel_z + torque * p.rew_torque)
    r = wp.max(r, 0.0)
    fell = bool(False)
    for k in range(s.sensordata.shape[1]):  # touch: the base, then each thigh
        if s.sensordata[w, k] > p.contact_threshold:
            fell = True
    if end_step(w, s, r, p.max_episode_steps, fell):
        _start_episode(w, p, s)


@wp.kernel
def reset_worlds(p: QuadrupedParams, s: Worlds, mask: wp.array(dtype=wp.int32)):
    """Start a new episode in every world where ``mask`` is non-zero (`reset`)."""
    w = wp.tid()
    if mask[w] != 0:
        _start_episode(w, p, s)
