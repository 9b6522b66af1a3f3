"""The per-world arrays of a warp pool, as one Warp struct, and the action kernel every task
shares (one row per world; `gmi_drl.envs.warp.pool.WarpPool` builds them once, its arrays never
replaced, so a captured CUDA graph stays valid)."""

from __future__ import annotations

import warp as wp


@wp.struct
class Worlds:
    """Every array the task kernels read or write (MuJoCo Warp's ``Data`` arrays among them).

    ``task_state (num_envs, state_dim)``: floats a task keeps per world (Anymal's command).
    ``xpos``, ``xquat``, ``cvel``, ``subtree_com``: MuJoCo's body poses and velocities (the
    fingertip states of ShadowHand).
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
    obs: wp.array2d(dtype=wp.float32)
    task_state: wp.array2d(dtype=wp.float32)
    xpos: wp.array2d(dtype=wp.vec3)
    xquat: wp.array2d(dtype=wp.quat)
    cvel: wp.array2d(dtype=wp.spatial_vector)
    subtree_com: wp.array2d(dtype=wp.vec3)


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
def end_episode_totals(w: int, s: Worlds, r: wp.float32, max_episode_steps: wp.int32,
                       fell: bool, reward: wp.array(dtype=wp.float32),
                       terminated: wp.array(dtype=wp.bool), truncated: wp.array(dtype=wp.bool),
                       episode_return: wp.array(dtype=wp.float64),
                       episode_length: wp.array(dtype=wp.int32)) -> bool:
    """Record world ``w``'s step: reward, terminated (``fell``), truncated (time limit), episode
    totals including this step; returns whether the episode ended (the caller resets it)."""
    length = s.running_length[w] + 1
    total = s.running_return[w] + wp.float64(r)
    timeout = length >= max_episode_steps
    reward[w] = r
    terminated[w] = fell
    truncated[w] = timeout and not fell
    episode_return[w] = total
    episode_length[w] = length
    s.running_return[w] = total
    s.running_length[w] = length
    return fell or timeout


@wp.func
def keep_final_obs(w: int, s: Worlds, final_obs: wp.array2d(dtype=wp.float32)):
    """Copy world ``w``'s observation (its episode's last) to ``final_obs``."""
    for i in range(s.obs.shape[1]):
        final_obs[w, i] = s.obs[w, i]
