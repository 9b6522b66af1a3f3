"""What the warp tasks' definitions share: gymnasium-robotics' MJCF assets, found without
importing that package, and MuJoCo's quaternion rotation for the tasks' NumPy references."""

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
