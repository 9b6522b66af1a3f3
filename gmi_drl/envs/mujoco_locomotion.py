"""Native mujoco_locomotion tasks (being written)."""


def register_tasks(register) -> None:
    """Register this module's tasks with `gmi_drl.envs.register`."""
