"""The warp engine: GPU simulators on MuJoCo Warp, every world of a pool in one batched model.

Source: the GMI-DRL paper §1-§3 and Table 6, whose tasks follow Isaac
Gym's task definitions (IsaacGymEnvs). Modules:

- `pool`: `WarpPool`, the engine (the pool API over MuJoCo Warp; CUDA graphs; tensors out).
- `worlds`: the per-world arrays every task kernel reads and writes, and the action kernel.
- `locomotion`, `locomotion_kernels`: Ant and Humanoid (walk to a target).
- `quadruped`, `quadruped_kernels`: Anymal (track a commanded base velocity).
- `balance`, `balance_kernels`: BallBalance (a tray on three legs keeps a ball up).
- `hand`, `hand_kernels`: ShadowHand (turn a block in the hand to a goal orientation).
- `franka`, `franka_kernels`: FrankaCabinet (a Franka arm opens a drawer).

A task definition (no Warp needed to read it: the registry does) has ``task_id``,
``obs_dim``, ``action_dim``, ``policy`` (Table 6's hidden sizes), ``max_episode_steps``,
``frame_skip``, ``control_dt``, ``state_dim`` (task floats kept per world, e.g. Anymal's
command), ``build_model()``, ``layout(model)`` and ``kernels`` (the name of its kernel module);
the kernel module has ``make_params(task, layout, device)``, ``finish_step``,
``reset_worlds``; where actions are not ``scale x action + offset`` (the task's
``action_map``), its own ``apply_actions``; where the observation reads body states,
``BODY_STATES = True`` and ``observe_reset``. A definition with ``episode_metric`` (a name)
has its kernel ``count`` something per episode (`gmi_drl.envs.warp.worlds.count`).
"""

from __future__ import annotations


def robotics_asset(task_id: str, *parts: str) -> str:
    """A path in gymnasium-robotics' MJCF assets (``envs/assets/<parts>``), found without
    importing the package.

    Raises:
        RuntimeError: gymnasium-robotics is not installed (the message says how to install it).
    """
    import importlib.util
    import os

    spec = importlib.util.find_spec("gymnasium_robotics")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{task_id} needs an MJCF of gymnasium-robotics; pip install "
                           "-e '.[gpu]' in the checkout (or gymnasium-robotics)")
    return os.path.join(spec.submodule_search_locations[0], "envs", "assets", *parts)


def rotate(q, v, inverse: bool = False):
    """``v (3,)`` rotated by the unit quaternion ``q = (w, x, y, z)`` (MuJoCo's order), or by its
    inverse, in float64 through MuJoCo's ``mju_rotVecQuat``: the tasks' NumPy references."""
    import mujoco
    import numpy as np

    q = np.asarray(q, np.float64) * ([1.0, -1.0, -1.0, -1.0] if inverse else 1.0)
    out = np.zeros(3)
    mujoco.mju_rotVecQuat(out, np.asarray(v, np.float64), q)
    return out


def tasks() -> dict:
    """``{task_id: task definition}`` of every warp task (imports MuJoCo, not Warp)."""
    from gmi_drl.envs.warp import balance, franka, hand, locomotion, quadruped

    return {t.task_id: t for t in (locomotion.ANT, locomotion.HUMANOID, quadruped.ANYMAL,
                                   balance.BALL_BALANCE, franka.FRANKA_CABINET,
                                   hand.SHADOW_HAND)}
