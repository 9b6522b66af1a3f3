"""The registry's Atari factory: one name per game, and the choice between the two engines.

``engine="native"`` is `gmi_drl.envs.atari_native.NativeAtariEngine` (every env on one shared
queue of C++ threads), ``engine="ale"`` `gmi_drl.envs.atari.AtariEngine` (ale-py's vector envs
in groups); both share `gmi_drl.envs.atari`'s options and outputs. This module imports both, so
neither engine module imports the other's chooser (no import cycle).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gmi_drl.envs import atari_native
from gmi_drl.envs.atari import GAMES, AtariEngine
from gmi_drl.envs.spec import AutoresetMode, EnvSpec

ENGINES = ("auto", "native", "ale")


def register_tasks(register) -> None:
    """Register the `GAMES` task ids with `gmi_drl.envs.register` (nothing is built or imported).

    Any other ROM ale-py ships registers the same way, e.g.
    ``register("Alien-v5", engine=functools.partial(make_engine, "Alien-v5"), game="alien")``.
    """
    for task_id, game in GAMES.items():
        register(task_id, engine=functools.partial(make_engine, task_id), game=game)


def make_engine(task_id: str, *, num_envs: int, env_batch_size: int, num_threads: int,
                seeds: np.ndarray, autoreset: AutoresetMode, game: str, engine: str = "auto",
                 **options: Any) -> tuple[EnvSpec, "AtariEngine"]:
    """The registry's factory: ``(EnvSpec, AtariEngine)`` for ``num_envs`` envs of ROM ``game``.

    Args:
        task_id: the name put in the spec (``max_episode_steps=None``: the emulator applies the
            time limit).
        num_envs, env_batch_size, autoreset: as `gmi_drl.envs.make`. seeds: each env's first
            seed (`gmi_drl.envs.spec.env_seeds`).
        num_threads: C++ emulator threads (of the native core, or of a pool that is one group).
        game: ale-py ROM id, e.g. ``"pong"`` (snake case).
        engine: ``"native"`` (`gmi_drl.envs.atari_native.NativeAtariEngine`: every env on one
            shared queue of C++ threads; raises where the core is not built), ``"ale"`` (ale-py's
            vector envs in groups, see the module docstring), or ``"auto"`` (native where it is
            built and no ``group_size`` is given).
        **options: overrides of `DEFAULTS` (EnvPool's option names).

    Raises:
        ValueError: an unknown ``engine``; see `AtariEngine`.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} must be one of {ENGINES}")
    cls = AtariEngine
    if engine != "ale":
        if engine == "native" or (atari_native.core is not None
                                  and options.get("group_size") is None):
            cls = atari_native.NativeAtariEngine
    engine = cls(game, num_envs, seeds, autoreset, env_batch_size=env_batch_size,
                  num_threads=num_threads, **options)
    spec = EnvSpec(task_id, engine.observation_space, engine.action_space, None)
    return spec, engine
