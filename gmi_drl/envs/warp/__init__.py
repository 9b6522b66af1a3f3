"""The warp engine: GPU simulators on MuJoCo Warp, every world of a pool in one batched model.

Source: the GMI-DRL paper §1-§3 and Table 6, whose tasks follow Isaac
Gym's task definitions (IsaacGymEnvs). Modules:

- `pool`: `WarpPool`, the engine (the pool API over MuJoCo Warp; CUDA graphs; tensors out).
- `worlds`: the per-world arrays every task kernel reads and writes, and the action kernel.
- `assets`: where the tasks' MJCF files come from, and the quaternion rotation of their NumPy
  references.
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


def tasks() -> dict:
    """``{task_id: task definition}`` of every warp task (imports MuJoCo, not Warp)."""
    from gmi_drl.envs.warp import balance, franka, hand, locomotion, quadruped

    return {t.task_id: t for t in (locomotion.ANT, locomotion.HUMANOID, quadruped.ANYMAL,
                                   balance.BALL_BALANCE, franka.FRANKA_CABINET,
                                   hand.SHADOW_HAND)}
