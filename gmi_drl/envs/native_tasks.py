"""The native tasks gmi-drl ships, registered on first use of the registry."""

from __future__ import annotations


def register_all(register) -> None:
    """Call ``register(task_id, engines=...)`` once per native task, with every engine each
    module offers for it (classic control, MuJoCo, Atari, MuJoCo Warp)."""
    from gmi_drl.envs import (atari_engines, cartpole_native, classic_control,
                              mujoco_locomotion, mujoco_threads)
    from gmi_drl.envs.warp import pool as warp_pool

    table: dict[str, dict] = {}
    for module in (classic_control, cartpole_native, mujoco_locomotion, mujoco_threads,
                   atari_engines, warp_pool):
        for task_id, engines in module.engines().items():
            table.setdefault(task_id, {}).update(engines)
    for task_id, engines in table.items():
        register(task_id, engines=engines)
