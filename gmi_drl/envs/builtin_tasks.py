"""The tasks gmi-drl ships (on its C++, NumPy, ALE and Warp engines), registered on first use
of the registry."""

from __future__ import annotations

import functools
import importlib
import logging
import os

log = logging.getLogger(__name__)

_PLAIN = ("gmi_drl.envs.classic_control", "gmi_drl.envs.cartpole_native",
          "gmi_drl.envs.atari_engines", "gmi_drl.envs.cpp_env")
#: the engines that import MuJoCo: left out, with one warning, where MuJoCo cannot be imported
_MUJOCO = ("gmi_drl.envs.mujoco_locomotion", "gmi_drl.envs.mujoco_threads",
           "gmi_drl.envs.warp.pool")


@functools.cache
def mujoco_unavailable() -> str | None:
    """Why ``import mujoco`` fails in this process, with what to do (None: it imports). The
    usual cause is ``MUJOCO_GL`` naming a rendering backend whose libraries are missing
    (``osmesa`` without libOSMesa), which breaks the import itself, not only rendering."""
    try:
        importlib.import_module("mujoco")
    except Exception as e:  # noqa: BLE001 - the backends raise ImportError, AttributeError, ...
        gl = os.environ.get("MUJOCO_GL")
        fix = (f"MUJOCO_GL={gl} names a rendering backend this machine cannot load: unset it "
               "(training needs no rendering), or install that backend's libraries"
               if gl else "reinstall it: pip install --force-reinstall mujoco")
        return f"MuJoCo failed to import ({type(e).__name__}: {e}); {fix}"
    return None


def register_all(register) -> None:
    """Call ``register(task_id, engines=...)`` once per native task, with every engine each
    module offers for it (classic control, MuJoCo, Atari, MuJoCo Warp). Where MuJoCo cannot be
    imported (`mujoco_unavailable`) its engines are left out with a warning: the other tasks
    still run."""
    names = _PLAIN
    if (reason := mujoco_unavailable()) is None:
        names += _MUJOCO
    else:
        log.warning("the MuJoCo tasks are unavailable: %s", reason)
    table: dict[str, dict] = {}
    for name in names:
        for task_id, engines in importlib.import_module(name).engines().items():
            table.setdefault(task_id, {}).update(engines)
    for task_id, engines in table.items():
        register(task_id, engines=engines)
