"""The native tasks gmi-drl ships, registered on first use of the registry."""

from __future__ import annotations


def register_all(register) -> None:
    """Call ``register`` for every native task (classic control, MuJoCo, Atari)."""
    from gmi_drl.envs import (atari_engines, cartpole_native, classic_control,
                              mujoco_locomotion, mujoco_threads)
    from gmi_drl.envs.warp import pool as warp_pool

    classic_control.register_tasks(register)
    register(cartpole_native.TASK_ID, pool=cartpole_native.make_pool)  # C++ where built
    mujoco_locomotion.register_tasks(register)
    mujoco_threads.register_tasks(register)  # the v5 locomotion tasks: C++ threads where built
    atari_engines.register_tasks(register)
    warp_pool.register_tasks(register)  # GMI-DRL's Table 6 tasks on MuJoCo Warp
