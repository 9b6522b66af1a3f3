"""The per-world arrays of a warp pool, as one Warp struct, and the action kernel every task
shares (one row per world; `gmi_drl.envs.warp.pool.WarpPool` builds them once, its arrays never
replaced, so a captured CUDA graph stays valid)."""

from __future__ import annotations

import warp as wp

# the pools never differentiate through a kernel: no adjoints to compile (half a module's time)
wp.set_module_options({"enable_backward": False})


@wp.struct
class Worlds:
    """Every array the task kernels read or write (MuJoCo Warp's ``Data`` arrays among them).

    ``task_state (num_envs, state_dim)``: floats a task keeps per world (Anymal's command).
    ``xpos``, ``xquat``, ``cvel``, ``subtree_com``: MuJoCo's body poses and velocities (the
    fingertip states of ShadowHand). ``final_obs`` to ``episode_metric``: what a step returns
    (``episode_metric``: the total of the task's own per-episode count, ShadowHand's goals
    reached, kept by `count`).
    """

    seed: wp.array(dtype=wp.int32)
    resets: wp.array(dtype=wp.int32)
    qpos: wp.array2d(dtype=wp.float32)
    qvel: wp.array2d(dtype=wp.float32)
    qacc_warmstart: wp.array2d(dtype=wp.float32)
    sensordata: wp.array2d(dtype=wp.float32)
    qfrc_actuator: wp.array2d(dtype=wp.float32)
    actions: wp.array2d(dtype=wp.float32)
    potentials: wp.array(dtype=wp.float64)
    running_return: wp.array(dtype=wp.float64)
    running_length: wp.array(dtype=wp.int32)
    running_metric: wp.array(dtype=wp.float32)
    obs: wp.array2d(dtype=wp.float32)
    task_state: wp.array2d(dtype=wp.float32)
    xpos: wp.array2d(dtype=wp.vec3)
    xquat: wp.array2d(dtype=wp.quat)
    cvel: wp.array2d(dtype=wp.spatial_vector)
    subtree_com: wp.array2d(dtype=wp.vec3)
    final_obs: wp.array2d(dtype=wp.float32)
    reward: wp.array(dtype=wp.float32)
    terminated: wp.array(dtype=wp.bool)
    truncated: wp.array(dtype=wp.bool)
    episode_return: wp.array(dtype=wp.float64)
    episode_length: wp.array(dtype=wp.int32)
    episode_metric: wp.array(dtype=wp.float32)


def make_worlds(data, **arrays) -> Worlds:
    """A `Worlds` of MuJoCo Warp ``data`` and the pool's own ``arrays`` (by field name)."""
    worlds = Worlds()
    for name in ("qpos", "qvel", "qacc_warmstart", "sensordata", "qfrc_actuator", "xpos", "xquat",
                 "cvel", "subtree_com"):
        setattr(worlds, name, getattr(data, name))
    for name, array in arrays.items():
        setattr(worlds, name, array)
    return worlds


@wp.kernel
def apply_actions(actions_in: wp.array2d(dtype=wp.float32), scale: wp.array(dtype=wp.float32),
                  offset: wp.array(dtype=wp.float32), actions: wp.array2d(dtype=wp.float32),
                  ctrl: wp.array2d(dtype=wp.float32)):
    """Clip actions to [-1, 1] (Isaac Gym's ``clipActions``) into the step's actions, and set
    each actuator's control to ``action x scale + offset`` (Ant/Humanoid: the motor command,
    ``ctrl x gear`` being Isaac's ``action x motor effort``; Anymal: the PD target
    ``action_scale x action + default angle``)."""
    w, a = wp.tid()
    x = wp.clamp(actions_in[w, a], -1.0, 1.0)
    actions[w, a] = x
    ctrl[w, a] = x * scale[a] + offset[a]


@wp.func
def end_step(w: int, s: Worlds, r: wp.float32, max_episode_steps: wp.int32, ended: bool) -> bool:
    """Record world ``w``'s step: reward ``r``, terminated (``ended``: the task's end), truncated
    (time limit), episode totals including this step, and where the episode ended its last
    observation in ``final_obs``. Returns whether it ended (the caller starts the next)."""
    length = s.running_length[w] + 1
    total = s.running_return[w] + wp.float64(r)
    timeout = length >= max_episode_steps
    s.reward[w] = r
    s.terminated[w] = ended
    s.truncated[w] = timeout and not ended
    s.episode_return[w] = total
    s.episode_length[w] = length
    s.running_return[w] = total
    s.running_length[w] = length
    s.episode_metric[w] = s.running_metric[w]
    if ended or timeout:
        for i in range(s.obs.shape[1]):
            s.final_obs[w, i] = s.obs[w, i]
        return True
    return False


@wp.func
def count(w: int, s: Worlds, x: wp.float32):
    """Add ``x`` to world ``w``'s per-episode count (before this step's `end_step`)."""
    s.running_metric[w] = s.running_metric[w] + x


@wp.func
def start_totals(w: int, s: Worlds):
    """World ``w`` starts an episode: its running return, length and count restart."""
    s.running_return[w] = wp.float64(0.0)
    s.running_length[w] = 0
    s.running_metric[w] = wp.float32(0.0)
