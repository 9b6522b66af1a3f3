"""The Atari tasks' engines for the registry: one task id per game, two engines each.

``engine="native"`` is `gmi_drl.envs.atari_native.NativeAtariEngine` (every env on one shared
queue of C++ threads), ``engine="ale"`` `gmi_drl.envs.atari.AtariEngine` (ale-py's vector envs
in groups); both share `gmi_drl.envs.atari`'s options and outputs. This module imports both, so
neither engine module imports the other (no import cycle).
"""

from __future__ import annotations

import functools
from typing import Any

from gmi_drl.envs import atari_native
from gmi_drl.envs.atari import GAMES, AtariEngine
from gmi_drl.envs.factories import EngineEntry, PoolRequest
from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.spec import EnvSpec


def _build(cls: type[AtariEngine], task_id: str, request: PoolRequest, *, game: str,
           **options: Any) -> EnvPool:
    """An Atari pool of ROM ``game`` on ``cls``'s engine.

    Args:
        cls: `AtariEngine` (``ale``) or `gmi_drl.envs.atari_native.NativeAtariEngine`
            (``native``).
        task_id: the name put in the spec (``max_episode_steps=None``: the emulator applies the
            time limit).
        request: the validated pool request (``num_threads``: C++ emulator threads of the native
            core, or of an ale-py vector env that is one group).
        game: ale-py ROM id, e.g. ``"pong"`` (snake case).
        **options: overrides of `gmi_drl.envs.atari.DEFAULTS` (EnvPool's option names).

    Raises:
        ValueError: see `AtariEngine`.
    """
    engine = cls(game, request.num_envs, request.seeds, request.autoreset,
                 env_batch_size=request.env_batch_size, num_threads=request.num_threads,
                 **options)
    spec = EnvSpec(task_id, engine.observation_space, engine.action_space, None)
    return request.pool(spec, engine)


def _native_unavailable(options: dict[str, Any]) -> str | None:
    if options.get("group_size") is not None:
        return (f"group_size={options['group_size']} applies to engine='ale' only (the native "
                "engine has no groups)")
    return None if atari_native.core is not None else atari_native.unavailable_reason


def entries(task_id: str, game: str) -> dict[str, EngineEntry]:
    """The two engines of one Atari task (ROM ``game``): ``native`` (every env on one shared
    queue of C++ threads; not where the core is missing or a ``group_size`` is given) and
    ``ale`` (ale-py's vector envs in groups)."""
    native = functools.partial(_build, atari_native.NativeAtariEngine, task_id, game=game)
    return {"native": EngineEntry(native, unavailable=_native_unavailable),
            "ale": EngineEntry(functools.partial(_build, AtariEngine, task_id, game=game))}


def engines() -> dict[str, dict[str, EngineEntry]]:
    """The `GAMES`' engines (the registry's table: task id -> engine name -> `EngineEntry`).

    Any other ROM ale-py ships registers the same way, e.g.
    ``gmi_drl.envs.register("Alien-v5", engines=entries("Alien-v5", "alien"))``.
    """
    return {task_id: entries(task_id, game) for task_id, game in GAMES.items()}
