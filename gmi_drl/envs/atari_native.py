"""Atari on the native core ``gmi_drl.envs._atari_core`` (``csrc/atari_core.cpp``): the loader
and `NativeAtariEngine`.

The core calls ale-py's emulator class ``ale::vector::PreprocessedEnv`` through the symbols the
``ale_py._ale_py`` extension exports, and is not linked against it (the wheel ships no library to
link). Its calls go through function pointers that ``_atari_core.bind`` looks up in the already
loaded ``_ale_py`` (``dlopen`` with ``RTLD_NOLOAD | RTLD_LOCAL``, then ``dlsym``), so nothing of
ale-py enters the global symbol scope (it also exports zlib and SDL functions that other
libraries must not bind to). The core is compiled against the headers of exactly one ale-py
version (setup.py) and is used only with that version installed.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from gmi_drl.envs.atari import _FINISH, _STEP, AtariEngine
from gmi_drl.envs.engine import queue_workers


def _load() -> tuple[ModuleType | None, str | None]:
    try:
        import ale_py
        from ale_py import _ale_py

        from gmi_drl.envs import _atari_core
    except ImportError as e:  # not built (no compiler or no network at install time)
        return None, f"the native core gmi_drl.envs._atari_core is not available ({e})"
    if _atari_core.ALE_PY_VERSION != ale_py.__version__:
        return None, (f"the native core was built against ale-py {_atari_core.ALE_PY_VERSION} "
                      f"but ale-py {ale_py.__version__} is installed; reinstall gmi-drl")
    try:
        _atari_core.bind(_ale_py.__file__)
    except RuntimeError as e:
        return None, f"the native core cannot call ale-py: {e}"
    return _atari_core, None


core, unavailable_reason = _load()
"""The ``_atari_core`` module, or ``None`` with `unavailable_reason` saying why."""


class NativeAtariEngine(AtariEngine):
    """`AtariEngine` on the native core: every env on one shared queue of C++ threads.

    The emulators, their results and the game bookkeeping are those of ``group_size=1`` on
    ale-py's vector env (one env per ale-py env), so trajectories are identical; but the envs
    share ``num_threads`` threads (EnvPool's design) instead of one thread each, and a batch
    comes back with one wake-up. The core writes observations straight into the pool's slots;
    rows of ordinary steps are then recorded with whole-batch array operations, the rest (new
    games, life losses, the young frame stack after a new game) one by one.

    Args: as `AtariEngine`; ``group_size`` must be ``None`` (groups are ale-py's).

    Raises:
        ValueError: as `AtariEngine`, or the core is not available (the reason).
    """

    def _plan_groups(self, k: int | None, num_envs: int, batch: int, errors: list[str]) -> int:
        if k is not None:
            errors.append(f"group_size={k} applies to engine='ale' only (the native engine "
                          "has no groups)")
        if core is None:
            errors.append(f"engine='native' cannot run: {unavailable_reason}")
        return 1

    def _start(self, rom: str, ale_options: dict[str, Any], num_threads: int) -> list[int]:
        n = self.num_envs
        self._raw = {"reward": np.zeros(n, np.int32), "terminated": np.zeros(n, bool),
                     "truncated": np.zeros(n, bool), "lives": np.zeros(n, np.int32),
                     "frame": np.zeros(n, np.int32)}
        obs = self.slots.obs.reshape(n, -1)  # a view: the core writes the slots themselves
        workers = queue_workers(num_threads)
        self._core = core.AtariCore(rom, n, workers, ale_options,
                                    {**self._raw, "obs": obs})
        return list(self._core.action_set())

    # --- Engine API ------------------------------------------------------------------------
    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        """Queue one step of each env; an env whose episode ended gets its reset instead.

        Raises:
            RuntimeError: an env was never reset (nothing is sent).
            EpisodeEndedError: autoreset ``disabled`` and an env's episode ended (nothing sent).
        """
        self._check_reset(ids.tolist())
        actions = self._restart_ended(ids, actions)
        self._core.send(ids, actions.astype(np.int64, copy=False))

    def wait(self, min_count: int = 1) -> np.ndarray:
        """Block until envs finish; return the finished ids in completion order (at least one).

        Raises:
            RuntimeError: nothing in flight, or an emulator failed (names the env id).
        """
        while True:
            done = self._core.wait(min_count)
            ready = self._record(done)
            if len(ready):
                return ready

    def pin(self, cores: list[int]) -> None:
        """Pin the core's worker thread ``k`` to CPU ``cores[k % len(cores)]`` (the thread
        that waits in `recv` is the caller's and keeps its own).

        Raises:
            RuntimeError: the kernel refused a core (not in this process's CPU set).
        """
        self._core.pin(cores)

    def close(self) -> None:
        """Stop every emulator thread (a step in flight finishes first). Idempotent."""
        if getattr(self, "_core", None) is not None:
            self._core.close()
            self._core = None

    # --- results ------------------------------------------------------------------------------
    def _record(self, done: np.ndarray) -> np.ndarray:
        """Record the results of ``done``; the ids that are ready (not sent again)."""
        raw = self._raw
        term, trunc = raw["terminated"][done], raw["truncated"][done]
        special = (self._kind[done] != _STEP) | term | trunc | (self._young[done] > 0)
        idx = np.flatnonzero(special)
        plain = done[~special] if len(idx) else done
        # new games, life losses, young stacks: one by one (they may send an env again)
        ready = [self._record_one(i) for i in done[idx].tolist()]
        if len(plain):  # ordinary steps: the game goes on, no flag, a full frame stack
            self._write_steps(plain, raw["reward"][plain], False, False)
            self.lives[plain] = raw["lives"][plain]
            self.end_of_game[plain] = False
        if all(ready):
            return done
        keep = ~special
        keep[idx] = ready
        return done[keep]

    def _record_one(self, i: int) -> bool:
        raw = self._raw
        return self._record_env(i, int(raw["reward"][i]), bool(raw["terminated"][i]),
                                bool(raw["truncated"][i]), int(raw["lives"][i]),
                                int(raw["frame"][i]))

    def _new_game_now(self, i: int, seed: int) -> tuple[int, int]:
        self._core.run_now(np.array([i], np.int64), np.zeros(1, np.int64),
                           np.array([seed], np.int64), True)
        return int(self._raw["lives"][i]), int(self._raw["frame"][i])

    def _restart_now(self, i: int) -> None:
        self._core.run_now(np.array([i], np.int64), np.array([self._restart_action], np.int64),
                           np.full(1, -1, np.int64), False)
        self._record_one(i)

    def _resend_restart(self, i: int) -> None:
        self._kind[i] = _FINISH
        self._core.send(np.array([i], np.int64), np.array([self._restart_action], np.int64))
