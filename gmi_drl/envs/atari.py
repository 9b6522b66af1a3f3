"""Atari 2600 tasks (``Pong-v5``, ``Breakout-v5``, ...) on ale-py's emulators.

Source: ale-py 0.12 (``ale::vector::PreprocessedEnv``, the per-env class of its C++ vector env:
emulation, frame skip, max-pooling, grayscale, INTER_AREA resize, frame stack, no-op starts and
FIRE reset, all in C++, outside the GIL); task ids, option names and defaults follow EnvPool
(the EnvPool paper; ``envpool/atari/atari_env.h``).

Engines (``make(..., engine=...)``, default ``"auto"``):

- ``"native"`` (`gmi_drl.envs.atari_native.NativeAtariEngine`, the default where the extension
  ``_atari_core`` is built): every env on one shared queue of ``num_workers`` C++ threads, as in
  EnvPool; ``send(actions, env_id)`` takes any subset of the envs not in flight and ``recv``
  returns the first to finish (``csrc/atari_core.cpp``). The caller steps queued envs while it
  waits in ``recv``, so the core runs ``num_workers - 1`` worker threads besides it.
- ``"ale"``: ale-py's own vector envs (``ale_py.ALEVectorInterface``) in groups, below. Used where
  the native core is not built, or when ``group_size`` is given.

Both run the same emulator code per env and give identical trajectories (tested).

The ``"ale"`` engine's design. ale-py's ``send`` takes no env ids: it routes action ``k`` to the
``k``-th env of its own last ``recv`` batch and wants exactly ``batch_size`` actions, and a partial-batch
ale-py env (``batch_size < num_envs``) can neither reset some envs nor return every env's first
observation. A pool, though, may send any subset of its envs and resets return every env given.
So the pool's envs are split into *groups* of consecutive ids, each group one synchronous ale-py
vector env (``batch_size == num_envs``, results in env order) on its own C++ thread(s); a group
steps once actions for all its envs were sent. The ``group_size`` option (default: automatic):

- full-batch pools (``env_batch_size == num_envs``): one group of every env on the pool's
  ``num_workers`` threads, one ale-py ``send``/``recv`` per step.
- partial-batch pools, and ``episodic_life`` with autoreset ``same_step``/``disabled`` (they step
  single envs after a life loss): ``group_size=1``, one ale-py env and one C++ thread per env
  (``num_workers`` is ignored). Any subset may be sent; ``wait`` blocks on the env sent first,
  so envs come back in the order they were sent. Each env step is a hand-off to its own thread
  and back (more context switches per env step than EnvPool's shared queue), which is why the
  native engine exists (``benchmarks/env_throughput.py`` compares them).
- ``group_size=k > 1`` (dividing ``num_envs`` and ``env_batch_size``): groups of ``k`` envs, one
  thread each (``num_workers`` threads when there is a single group); a ``recv`` returns whole
  groups, the first sent. Sending the ids a ``recv`` returned (EnvPool's loop) always works; a
  ``recv`` that would need a group whose actions were only partly sent raises `RuntimeError`
  instead of waiting forever.

Defaults (`DEFAULTS`; override any through ``make(task_id, ..., **kwargs)``): ``frame_skip=4``,
``img_height=img_width=84``, ``gray_scale=True``, ``stack_num=4``, ``noop_max=30``,
``episodic_life=True``, ``reward_clip=True``, ``use_fire_reset=True``,
``repeat_action_probability=0.0``, ``max_episode_steps=27000`` (agent steps, = 108000 frames),
``full_action_space=False``, ``maxpool=True``, plus ``group_size=None`` (the ``"ale"`` engine,
see above).
Observations are ``uint8 (stack_num, img_height, img_width)`` (``(stack_num, img_height,
img_width, 3)`` when ``gray_scale=False``; EnvPool uses ``(3 * stack_num, H, W)`` there), actions
``Discrete(len(minimal action set))`` (``int`` indices into it).

Differences from EnvPool 1.2.5 (checked with ``envpool.make_spec("Pong-v5").config``):

- EnvPool's own defaults are ``episodic_life=False``, ``reward_clip=False`` and ``seed=42``; the
  defaults here are the DQN/PPO settings usually passed to EnvPool (``episodic_life=True``,
  ``reward_clip=True``), and the seed is the pool's.
- Reset no-ops: ale-py presses FIRE (where the game has it and ``use_fire_reset``) and then does
  ``U{0..noop_max-1} - 1`` no-op frames; EnvPool does ``U{0..noop_max-1} + 1 - fire`` no-ops and
  then FIRE. With ``noop_max=1`` both reset to exactly ``reset_game`` + FIRE, and the frames,
  rewards and flags are then identical step for step (tested; game-over steps aside, below);
  otherwise the no-op random streams differ, so same-seed trajectories of the two libraries
  differ.
- Life loss with ``episodic_life``: both report ``terminated`` and the reset that follows
  continues the same game; EnvPool's reset runs 0-29 no-op frames and one FIRE frame unseen, here
  it is one agent step of FIRE (NOOP where the game has no FIRE or ``use_fire_reset=False``).
  (ale-py's own ``episodic_life`` restarts the whole game on every life loss, as Gymnasium's
  ``AtariPreprocessing(terminal_on_life_loss=True)``; it is not used.)
- An explicit ``reset`` starts a new game, except with autoreset ``disabled`` after a life loss,
  where it continues the game as above (EnvPool continues the game in both cases).
- The frame stack after a new game holds ``stack_num`` copies of its first frame, as in EnvPool
  and Gymnasium's ``FrameStackObservation`` (ale-py itself pads with zero frames).
- The step on which a game is over (not a life loss) can differ in its newest frame: when the
  game ends inside the frame skip, ale-py max-pools the previous step's two frames, EnvPool the
  frames it captured before the end.
- Not supported: EnvPool's ``zero_discount_on_life_loss`` and ``use_inter_area_resize=False``
  (resizing is always INTER_AREA, EnvPool's default).

Episode statistics. ``episode_return`` is the *unclipped* game score and ``episode_length`` the
agent steps of the current **game** (all lives, life-loss reset steps included), whatever
``episodic_life`` and ``reward_clip`` say: the numbers Atari learning curves in the literature
report. With ``episodic_life`` a life loss reports ``terminated`` while the game goes on, so such
a row holds the game's running score; `AtariEngine.end_of_game` marks the rows whose game
itself ended (game over or the time limit), `AtariEngine.lives` the lives left.

Seeding. Env ``i`` of a pool made with ``seed=s`` is first reset with seed ``s + i`` (ale-py
reloads the ROM with ALE ``random_seed = s + i`` and seeds the env's no-op generator with it);
later new games continue that generator. A trajectory therefore depends only on ``s + i`` and the
actions sent to env ``i``, not on ``num_envs``, ``env_batch_size``, grouping or timing (tested).
``s + i`` must lie in ``[0, 2**31 - 1]``.

Cost. Building a pool loads the ROM once per env, one after another, and the first reset reloads
it with the env's seed.
"""

from __future__ import annotations

import collections
from typing import Any

import gymnasium as gym
import numpy as np

from gmi_drl.envs.engine import Engine
from gmi_drl.envs.spec import AutoresetMode, env_seeds
from gmi_drl.envs.stepper import EpisodeEndedError, Slots

# task id -> ale-py ROM id (EnvPool's naming: CamelCase of the ROM id, "-v5").
GAMES: dict[str, str] = {
    "Pong-v5": "pong",
    "Breakout-v5": "breakout",
    "Qbert-v5": "qbert",
    "SpaceInvaders-v5": "space_invaders",
    "BeamRider-v5": "beam_rider",
    "Seaquest-v5": "seaquest",
    "Enduro-v5": "enduro",
    "MsPacman-v5": "ms_pacman",
}

DEFAULTS: dict[str, Any] = {
    "frame_skip": 4,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "stack_num": 4,
    "noop_max": 30,
    "episodic_life": True,
    "reward_clip": True,
    "use_fire_reset": True,
    "repeat_action_probability": 0.0,
    "max_episode_steps": 27000,
    "full_action_space": False,
    "maxpool": True,
    "group_size": None,
}

# ale-py / Gymnasium spellings, named in the error for an unknown option.
_ALIASES = {
    "frameskip": "frame_skip", "grayscale": "gray_scale", "reward_clipping": "reward_clip",
    "max_num_frames_per_episode": "max_episode_steps (in agent steps, not frames)",
    "terminal_on_life_loss": "episodic_life", "screen_size": "img_height/img_width",
    "sticky_actions": "repeat_action_probability",
}

_STEP, _RESTART, _FINISH = 0, 1, 2  # what an env's request in flight is (see AtariEngine)


def _check_options(options: dict[str, Any]) -> dict[str, Any]:
    errors = []
    for key in options:
        if key not in DEFAULTS:
            hint = f" (use {_ALIASES[key]})" if key in _ALIASES else ""
            errors.append(f"unknown Atari option {key!r}{hint}")
    opts = {**DEFAULTS, **{k: v for k, v in options.items() if k in DEFAULTS}}
    for key in ("frame_skip", "img_height", "img_width", "stack_num", "max_episode_steps"):
        v = opts[key]
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            errors.append(f"{key}={v!r} must be an int >= 1")
    v = opts["noop_max"]
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
        errors.append(f"noop_max={v!r} must be an int >= 0")
    v = opts["repeat_action_probability"]
    if not isinstance(v, (int, float, np.number)) or not 0.0 <= float(v) <= 1.0:
        errors.append(f"repeat_action_probability={v!r} must be in [0, 1]")
    v = opts["group_size"]
    if v is not None and (not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1):
        errors.append(f"group_size={v!r} must be None (automatic) or an int >= 1")
    if errors:
        raise ValueError("invalid Atari options: " + "; ".join(errors) +
                         f". Accepted: {sorted(DEFAULTS)}")
    return opts


class _Group:
    """Envs ``base .. base + size - 1`` in one synchronous ale-py vector env."""

    __slots__ = ("ale", "base", "size", "ids", "id_list", "actions", "ones", "pending",
                 "started", "restarting", "eog")

    def __init__(self, ale, base: int, size: int) -> None:
        self.ale, self.base, self.size = ale, base, size
        self.ids = np.arange(base, base + size, dtype=np.int64)
        self.id_list = self.ids.tolist()
        self.actions = [0] * size  # the next step's action per env, filled by send
        self.ones = [1.0] * size   # paddle strengths
        self.pending = 0           # actions filled so far
        self.started = False       # reset at least once (ale-py's first reset must cover all)
        self.restarting = False    # the step in flight resets some of its envs
        self.eog = False           # some row of the group may have end_of_game set


class AtariEngine(Engine):
    """``num_envs`` Atari games on ale-py C++ emulator threads; see the module docstring.

    Args:
        game: ale-py ROM id (``"pong"``).
        num_envs: sub-environments.
        seeds: ``(num_envs,)``, env ``i`` is first reset with seed ``seeds[i]`` (or an int ``s``:
            ``s + i``).
        autoreset: the `AutoresetMode`.
        env_batch_size: the pool's (``None``: ``num_envs``).
        num_threads: emulator threads when the pool is one group (else one per group).
        **options: overrides of `DEFAULTS`.

    Attributes:
        slots: per-env results (`Slots`): obs ``uint8``, reward ``float64`` (clipped to
            ``{-1, 0, 1}`` when ``reward_clip``), episode totals per *game* (module docstring).
        lives: ``(num_envs,) int32``, lives left in the game each env's row shows (0 in games
            without lives).
        end_of_game: ``(num_envs,) bool``, the row's step ended the game itself (game over or
            time limit), not only a life; inferred from ``lives``.
        group_size: envs per ale-py vector env (1: one per env).
        observation_space, action_space: single-env Gymnasium spaces.

    Raises:
        ValueError: unknown option (ale-py spellings are named with their equivalent), an option
            out of range, an unknown ROM, a seed outside ``[0, 2**31 - 1]``, or
            a ``group_size`` that cannot work (the message says why).
    """

    def __init__(self, game: str, num_envs: int, seeds, autoreset: AutoresetMode, *,
                 env_batch_size: int | None = None, num_threads: int = 1,
                 **options: Any) -> None:
        import ale_py
        from ale_py import roms

        opts = _check_options(options)
        self.mode = AutoresetMode(autoreset)
        self.num_envs = num_envs
        batch = num_envs if env_batch_size is None else env_batch_size
        self._episodic_life = bool(opts["episodic_life"])
        errors = []
        rom = roms.get_rom_path(game) if game in roms.get_all_rom_ids() else None
        if rom is None:
            errors.append(f"game={game!r} is not an ale-py ROM id (snake case, e.g. 'ms_pacman')")
        seeds = env_seeds(seeds, num_envs)
        if seeds.min() < 0 or seeds.max() > 2**31 - 1:
            errors.append(f"env seeds {seeds.min()}..{seeds.max()} are outside [0, 2**31 - 1] "
                          "(ALE's random_seed)")
        self.group_size = self._plan_groups(opts["group_size"], num_envs, batch, errors)
        if errors:
            raise ValueError("invalid Atari pool: " + "; ".join(errors))
        self._frame_skip = int(opts["frame_skip"])
        self._clip = bool(opts["reward_clip"])
        self._stack = int(opts["stack_num"])
        shape = (int(opts["stack_num"]), int(opts["img_height"]), int(opts["img_width"]))
        if not opts["gray_scale"]:
            shape += (3,)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.slots = Slots.allocate(num_envs, shape, np.uint8)
        ale_options = dict(
            frame_skip=int(opts["frame_skip"]), stack_num=int(opts["stack_num"]),
            img_height=int(opts["img_height"]), img_width=int(opts["img_width"]),
            grayscale=bool(opts["gray_scale"]), maxpool=bool(opts["maxpool"]),
            noop_max=int(opts["noop_max"]), use_fire_reset=bool(opts["use_fire_reset"]),
            # life loss: terminated, the game goes on (ale-py's episodic_life restarts it)
            episodic_life=False, life_loss_info=self._episodic_life,
            reward_clipping=False,  # clipped here, so episode_return is the game score
            max_episode_steps=int(opts["max_episode_steps"]) * self._frame_skip,
            repeat_action_probability=float(opts["repeat_action_probability"]),
            full_action_space=bool(opts["full_action_space"]))
        action_set = self._start(str(rom), ale_options, num_threads)
        fire, noop = ale_py.Action.FIRE.value, ale_py.Action.NOOP.value
        self._restart_action = (action_set.index(fire) if opts["use_fire_reset"]
                                and fire in action_set else action_set.index(noop))
        self.action_space = gym.spaces.Discrete(len(action_set))
        self.lives = np.zeros(num_envs, np.int32)
        self.end_of_game = np.zeros(num_envs, bool)
        self.episode_end = self.end_of_game  # the pool's info["episode_end"]: whole games
        self.extra_info = {"lives": self.lives}
        # Per-env state. Lists where single items are read per step, arrays where a group of
        # several envs is updated at once.
        self._first_seed: list[int | None] = seeds.tolist()
        self._num_unreset = num_envs          # envs whose first reset is still to come
        self._fresh = [False] * num_envs      # reset by a sibling's first reset, untouched since
        self._num_fresh = 0
        self._kind = np.zeros(num_envs, np.int8)        # _STEP / _RESTART / _FINISH in flight
        self._ended = np.zeros(num_envs, bool)          # latest result terminated or truncated
        self._real_end = np.zeros(num_envs, bool)       # ... and the game itself is over
        self._frame = np.zeros(num_envs, np.int64)      # ALE episode frame of the latest result
        self._game_return = np.zeros(num_envs, np.float64)  # unclipped score of the game
        self._game_length = np.zeros(num_envs, np.int64)    # agent steps of the game
        # Leading frames of ale-py's stack that are still its zero padding after a new game
        # (they are shown as copies of the game's first frame, as EnvPool does).
        self._young = np.zeros(num_envs, np.int64)

    def _plan_groups(self, k: int | None, num_envs: int, batch: int, errors: list[str]) -> int:
        """The envs per ale-py vector env (module docstring); appends why ``k`` cannot work."""
        singles = self._episodic_life and self.mode is not AutoresetMode.NEXT_STEP
        if k is None:  # automatic: see the module docstring
            return num_envs if batch == num_envs and not singles else 1
        if k > 1 and (num_envs % k or batch % k or singles):
            why = ("it must divide num_envs and env_batch_size" if not singles else
                   f"autoreset={self.mode.value!r} with episodic_life steps single envs after a "
                   "life loss")
            errors.append(f"group_size={k} impossible for num_envs={num_envs}, "
                          f"env_batch_size={batch}: {why}")
        return int(k)

    def _start(self, rom: str, ale_options: dict[str, Any], num_threads: int) -> list[int]:
        """Build the emulators; return the ALE action codes of the action indices."""
        import ale_py

        k = self.group_size
        n_groups = self.num_envs // k
        # One group: the pool's threads; several: one each (a group's thread then runs its envs
        # back to back, and groups finish one after another as EnvPool's envs do).
        threads = max(1, min(k, num_threads)) if n_groups == 1 else 1
        # Native SameStep only where no life loss needs a FIRE/NOOP step of a single env.
        ale_mode = "SameStep" if (self.mode is AutoresetMode.SAME_STEP and k > 1) else "NextStep"
        self._groups: list[_Group] = []
        self._in_flight: collections.deque[_Group] = collections.deque()
        try:
            for g in range(n_groups):
                ale = ale_py.ALEVectorInterface(rom, k, **ale_options, batch_size=k,
                                                num_threads=threads, autoreset_mode=ale_mode)
                self._groups.append(_Group(ale, g * k, k))
        except BaseException:
            self._groups.clear()
            raise
        return [a.value for a in self._groups[0].ale.get_action_set()]

    # --- Engine API ------------------------------------------------------------------------
    def send(self, ids: np.ndarray, actions: np.ndarray) -> None:
        """Record one action per env; a group starts stepping on its C++ thread(s) as soon as
        all its envs have one. Returns without waiting on the emulators.

        An env whose episode ended gets its reset instead (its action is ignored): a new game,
        or after a life loss one FIRE/NOOP step of the same game.

        Raises:
            RuntimeError: an env was never reset (nothing is sent).
            EpisodeEndedError: autoreset ``disabled`` and an env's episode ended (nothing sent).
        """
        id_list = ids.tolist()
        self._check_reset(id_list)
        k = self.group_size
        if k > 1 and len(id_list) == k:  # EnvPool's loop: the ids of one group, in order
            g = self._groups[id_list[0] // k]
            if not g.pending and id_list == g.id_list:
                self._send_group(g, actions)
                return
        act_list = self._restart_ended(ids, actions).tolist()
        groups, push = self._groups, self._in_flight.append
        if self.group_size == 1:
            for i, a in zip(id_list, act_list):
                g = groups[i]
                g.actions[0] = a
                g.ale.send(g.actions, g.ones)
                push(g)
            return
        fresh = self._fresh
        for i, a in zip(id_list, act_list):
            g = groups[i // k]
            if fresh[i]:
                fresh[i] = False
                self._num_fresh -= 1
            g.actions[i - g.base] = a
            g.pending += 1
            if g.pending == k:
                g.pending = 0
                g.restarting = bool((self._kind[g.base:g.base + k] != _STEP).any())
                g.ale.send(g.actions, g.ones)
                push(g)

    def _check_reset(self, id_list: list[int]) -> None:
        """Raise `RuntimeError` if an env of ``id_list`` was never reset."""
        if self._num_unreset and any(self._first_seed[i] is not None for i in id_list):
            bad = [i for i in id_list if self._first_seed[i] is not None]
            raise RuntimeError(f"env_id {bad}: reset() them before sending actions")

    def _restart_ended(self, ids: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """Mark what each env of ``ids`` runs next: its step, or the reset of an ended episode
        (which replaces its action with the FIRE/NOOP restart action); the actions to send.

        Raises:
            EpisodeEndedError: autoreset ``disabled`` and an env's episode ended (nothing marked).
        """
        ended = self._ended[ids]
        if not ended.any():
            self._kind[ids] = _STEP
            return actions
        if self.mode is AutoresetMode.DISABLED:
            raise EpisodeEndedError(f"env_id {ids[ended].tolist()}: episode ended and autoreset "
                                    "is disabled; call reset(env_id=...) for them before stepping")
        self._kind[ids] = np.where(ended, _RESTART, _STEP)
        return np.where(ended, self._restart_action, actions)

    def _send_group(self, g: _Group, actions: np.ndarray) -> None:
        """`send` for exactly the envs of group ``g``, in order (no action of it pending)."""
        b, e = g.base, g.base + g.size
        ended = self._ended[b:e]
        if ended.any():
            if self.mode is AutoresetMode.DISABLED:
                raise EpisodeEndedError(
                    f"env_id {g.ids[ended].tolist()}: episode ended and autoreset is disabled; "
                    "call reset(env_id=...) for them before stepping")
            self._kind[b:e] = np.where(ended, _RESTART, _STEP)
            actions = np.where(ended, self._restart_action, actions)
            g.restarting = True
        elif g.restarting:
            self._kind[b:e] = _STEP
            g.restarting = False
        if self._num_fresh:
            for i in g.id_list:
                if self._fresh[i]:
                    self._fresh[i] = False
                    self._num_fresh -= 1
        g.ale.send(actions.tolist(), g.ones)
        self._in_flight.append(g)

    def wait(self, min_count: int = 1) -> np.ndarray:
        """Block until the group sent first finishes; return its env ids (``int64``, in order).

        Raises:
            RuntimeError: nothing in flight; or only groups with actions for some of their envs,
                which cannot step; or ale-py failed (names the env ids).
        """
        in_flight = self._in_flight
        while in_flight:
            g = in_flight.popleft()
            try:
                result = g.ale.recv()
            except Exception as e:
                raise RuntimeError(f"Atari env_id {g.ids.tolist()} failed in ale-py: "
                                   f"{e!r}") from e
            if g.size == 1:
                if self._on_env_result(g, *result):
                    return g.ids
            else:
                self._on_group_result(g, *result)
                return g.ids
        partial = [g.ids.tolist() for g in self._groups if g.pending]
        if partial:
            raise RuntimeError(
                f"Atari pool: no group can step: the groups {partial} got actions for only some "
                f"of their envs (groups of {self.group_size} envs step together, as ale-py "
                "routes actions by batch position). Send actions for every env a recv() "
                "returned, or make the pool with group_size=1 to step envs one by one")
        raise RuntimeError("wait() with nothing in flight")

    def reset(self, ids: np.ndarray) -> None:
        """Reset ``ids`` (none in flight) and write their first observations; blocks.

        An env's first reset uses its seed; with autoreset ``disabled`` an env whose episode
        ended with a life loss continues its game (one FIRE/NOOP step); any other env starts a
        new game (its no-op generator continues).
        """
        if self.group_size == 1:
            for i in ids.tolist():
                self._reset_env(i)
            return
        k = self.group_size
        by_group: dict[int, list[int]] = {}
        for i in ids.tolist():
            by_group.setdefault(i // k, []).append(i - (i // k) * k)
        for gi, local in by_group.items():
            self._reset_group(self._groups[gi], local)

    def close(self) -> None:
        """Stop every emulator thread (a step in flight finishes first) and drop every buffer.

        Idempotent.
        """
        self._in_flight.clear()
        while self._groups:
            self._groups.pop().ale = None  # ale-py's destructor joins the group's threads

    # --- resets -------------------------------------------------------------------------------
    def _reset_env(self, i: int) -> None:
        """Reset env ``i`` (one env per ale-py env) in the calling thread; see `reset`."""
        if self._first_seed[i] is not None:
            lives, frame = self._new_game_now(i, self._first_seed[i])
            self._first_seed[i] = None
            self._num_unreset -= 1
        elif (self._ended[i] and not self._real_end[i]
              and self.mode is AutoresetMode.DISABLED):
            while self._ended[i]:  # the FIRE/NOOP step may itself end the episode (rare)
                self._kind[i] = _RESTART
                self._restart_now(i)
            return
        else:
            lives, frame = self._new_game_now(i, -1)
        self._reset_row(i, lives, frame)

    def _new_game_now(self, i: int, seed: int) -> tuple[int, int]:
        """Start a new game of env ``i`` (reseeded where ``seed >= 0``), its first observation
        in its obs row; its lives and episode frame number."""
        obs, info = self._groups[i].ale.reset([0], [seed])
        self.slots.obs[i] = obs[0]
        return int(info["lives"][0]), int(info["episode_frame_number"][0])

    def _restart_now(self, i: int) -> None:
        """Run env ``i``'s FIRE/NOOP step after a life loss and record it."""
        g = self._groups[i]
        g.actions[0] = self._restart_action
        g.ale.send(g.actions, g.ones)
        self._on_env_result(g, *g.ale.recv())

    def _reset_group(self, g: _Group, local: list[int]) -> None:
        s, b = self.slots, g.base
        if not g.started:  # ale-py: the first reset covers every env of the group
            seeds = [self._first_seed[b + j] for j in range(g.size)]
            obs, info = g.ale.reset(list(range(g.size)), seeds)
            g.started = True
            s.obs[b:b + g.size] = obs
            lives, frames = info["lives"].tolist(), info["episode_frame_number"].tolist()
            for j in range(g.size):
                self._first_seed[b + j] = None
                self._fresh[b + j] = True
                self._reset_row(b + j, lives[j], frames[j])
            self._num_unreset -= g.size
            self._num_fresh += g.size
        todo = [j for j in local if not self._fresh[b + j]]
        for j in local:
            if self._fresh[b + j]:
                self._fresh[b + j] = False
                self._num_fresh -= 1
        if todo:  # the others report their current state; their rows are left alone
            obs, info = g.ale.reset(todo, [-1] * len(todo))
            lives, frames = info["lives"].tolist(), info["episode_frame_number"].tolist()
            for j in todo:
                s.obs[b + j] = obs[j]
                self._reset_row(b + j, lives[j], frames[j])

    # --- per-env bookkeeping (the env's obs row is written before these run) ------------------
    def _write_steps(self, rows, rew: np.ndarray, term, trunc) -> None:
        """``rows`` (a slice or an index array) took one ordinary step with raw rewards ``rew``:
        add them to the game totals and write reward (clipped if asked), flags and totals."""
        s = self.slots
        ret = self._game_return[rows] + rew
        length = self._game_length[rows] + 1
        self._game_return[rows] = ret
        self._game_length[rows] = length
        s.reward[rows] = np.sign(rew) if self._clip else rew
        s.terminated[rows] = term
        s.truncated[rows] = trunc
        s.episode_return[rows] = ret
        s.episode_length[rows] = length

    def _new_game(self, i: int, lives: int, frame: int) -> None:
        """State of env ``i`` at the first observation of a new game; pads its frame stack."""
        if self._stack > 1:
            row = self.slots.obs[i]
            row[:-1] = row[-1]
            self._young[i] = self._stack - 1
        self._game_return[i] = 0.0
        self._game_length[i] = 0
        self._frame[i] = frame
        self.lives[i] = lives
        self._ended[i] = self._real_end[i] = False

    def _age(self, i: int, row: np.ndarray) -> None:
        """One more ale-py step of env ``i``, whose stack ``row`` may still start with padding."""
        y = int(self._young[i]) - 1
        if y >= 0:
            self._young[i] = y
            if y:
                row[:y] = row[y]

    def _reset_row(self, i: int, lives: int, frame: int) -> None:
        """Row ``i`` becomes the first step of a new game: reward 0, no flags, totals 0."""
        s = self.slots
        s.reward[i] = 0.0
        s.terminated[i] = s.truncated[i] = False
        s.episode_return[i] = 0.0
        s.episode_length[i] = 0
        self.end_of_game[i] = False
        self._new_game(i, lives, frame)

    def _ended_game(self, i: int, truncated: bool, lives: int) -> bool:
        """Whether a terminated/truncated result of env ``i`` ended the game, not only a life
        (``self.lives[i]``: the lives before it)."""
        return bool(truncated or not self._episodic_life or lives == 0
                    or lives >= self.lives[i])  # terminated without losing a life: game over

    def _step_row(self, i: int, raw: int, t: bool, tr: bool, lives: int, frame: int) -> bool:
        """Record an ordinary step of env ``i`` in its row; True if its episode ended."""
        g_ret = self._game_return[i] + raw
        g_len = self._game_length[i] + 1
        self._game_return[i], self._game_length[i] = g_ret, g_len
        self._frame[i] = frame
        s = self.slots
        s.reward[i] = ((raw > 0) - (raw < 0)) if self._clip else raw
        s.terminated[i], s.truncated[i] = t, tr
        s.episode_return[i], s.episode_length[i] = g_ret, g_len
        if t or tr:
            real = self._ended_game(i, tr, lives)
            self._ended[i], self._real_end[i] = True, real
            self.end_of_game[i] = real
            self.lives[i] = lives
            return True
        self.end_of_game[i] = False
        self.lives[i] = lives
        return False

    def _restart_row(self, i: int, raw: int, t: bool, tr: bool, lives: int, frame: int,
                     report: bool) -> None:
        """Record the reset of ended env ``i``: a new game (ale-py restarts a game that is over
        before stepping; the frame counter tells), or one FIRE/NOOP step after a life loss.

        ``report``: the row becomes the reset step (reward 0, totals of the game so far); else
        (same_step) only the state changes, the row keeps the ending step's values.
        """
        if self._real_end[i] or frame != self._frame[i] + self._frame_skip:
            if report:
                self._reset_row(i, lives, frame)
            else:
                self._new_game(i, lives, frame)
            return
        self._game_return[i] += raw  # counts towards the game; not reported as reward
        self._game_length[i] += 1
        self._frame[i] = frame
        ended = t or tr
        real = ended and self._ended_game(i, tr, lives)
        self.lives[i] = lives
        self._ended[i], self._real_end[i] = ended, real
        if report:
            s = self.slots
            s.reward[i] = 0.0
            s.terminated[i], s.truncated[i] = t, tr
            s.episode_return[i] = self._game_return[i]
            s.episode_length[i] = self._game_length[i]
            self.end_of_game[i] = real

    def _on_env_result(self, g: _Group, obs, rew, term, trunc, info) -> bool:
        """``group_size=1``: record env ``g.base``'s result; False when it was sent again
        (same_step: the episode ended, its reset is under way, the id is returned after it)."""
        i = g.base
        self.slots.obs[i] = obs[0]
        return self._record_env(i, int(rew[0]), bool(term[0]), bool(trunc[0]),
                                int(info["lives"][0]), int(info["episode_frame_number"][0]))

    def _record_env(self, i: int, raw: int, t: bool, tr: bool, lives: int, frame: int) -> bool:
        """Record the result of env ``i`` run alone, its observation already in its obs row;
        False when it was sent again (`_resend_restart`: same_step, the episode ended and its
        reset is under way; the id is returned after it)."""
        kind = self._kind[i]
        row = self.slots.obs[i]
        if kind == _STEP:
            if self._step_row(i, raw, t, tr, lives, frame) \
                    and self.mode is AutoresetMode.SAME_STEP:
                final = self.slots.final_obs[i]
                final[...] = row
                self._age(i, final)
                self._resend_restart(i)
                return False
            self._age(i, row)
            return True
        self._age(i, row)  # a new game re-pads it below
        self._restart_row(i, raw, t, tr, lives, frame, report=kind == _RESTART)
        if kind == _FINISH and self._ended[i]:  # the FIRE/NOOP step ended it again (rare)
            self._resend_restart(i)
            return False
        return True

    def _resend_restart(self, i: int) -> None:
        """Send env ``i`` (group_size 1) its FIRE/NOOP step that finishes a reset."""
        self._kind[i] = _FINISH
        g = self._groups[i]
        g.actions[0] = self._restart_action
        g.ale.send(g.actions, g.ones)
        self._in_flight.append(g)

    def _on_group_result(self, g: _Group, obs, rew, term, trunc, info) -> None:
        """``group_size > 1``: record a whole group's results (rows ``g.base ..``, in env order).

        Ordinary steps that end nothing are recorded with whole-group array operations; the rows
        of resets and of ended episodes then go through the per-env code.
        """
        s, b, e = self.slots, g.base, g.base + g.size
        s.obs[b:e] = obs
        young = self._young[b:e]
        if young.any():  # rows of a new game re-pad below
            for j in np.flatnonzero(young).tolist():
                self._age(b + j, s.obs[b + j])
        lives, frames = info["lives"], info["episode_frame_number"]
        special = term | trunc
        if g.restarting:
            special |= self._kind[b:e] != _STEP
        if not special.any():  # the common case: ordinary steps only
            self._write_steps(slice(b, e), rew, False, False)
            self.lives[b:e] = lives
            if g.eog:
                self.end_of_game[b:e] = False
                g.eog = False
            return  # (_frame is only read after an ending step, which is recorded below)
        g.eog = True
        if not special.all():
            ret, length = self._game_return[b:e], self._game_length[b:e]
            frame, old_lives = self._frame[b:e], self.lives[b:e]
            idx = np.flatnonzero(special)  # the per-env code below wants these rows' old state
            saved = ret[idx], length[idx], frame[idx], old_lives[idx]
            frame[:] = frames
            old_lives[:] = lives
            self._write_steps(slice(b, e), rew, term, trunc)
            self.end_of_game[b:e] = False
            ret[idx], length[idx], frame[idx], old_lives[idx] = saved
        idx = np.flatnonzero(special).tolist()
        raws, terms, truncs = rew.tolist(), term.tolist(), trunc.tolist()
        lives, frames = lives.tolist(), frames.tolist()
        same_step = self.mode is AutoresetMode.SAME_STEP
        for j in idx:
            i = b + j
            if self._kind[i] == _STEP:
                if self._step_row(i, raws[j], terms[j], truncs[j], lives[j], frames[j]) \
                        and same_step:  # ale-py reset it already; lives/frame are the new game's
                    s.final_obs[i] = info["final_obs"][j]
                    self._new_game(i, lives[j], frames[j])
            else:
                self._restart_row(i, raws[j], terms[j], truncs[j], lives[j], frames[j], True)
