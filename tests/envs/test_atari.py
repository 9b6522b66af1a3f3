"""Atari tasks (gmi_drl.envs.atari): spaces, seeding, async semantics, the three autoreset modes
with life losses, per-game episode statistics, and step-for-step equality with EnvPool; on both
engines: the native core (the default where it is built) and ale-py's vector envs in groups."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import gmi_drl.envs as envs
from gmi_drl.envs import atari_native
from gmi_drl.envs.atari import GAMES
from gmi_drl.envs.stepper import EpisodeEndedError

needs_native = pytest.mark.skipif(atari_native.core is None,
                                  reason=f"{atari_native.unavailable_reason}")
NATIVE = pytest.param("native", marks=needs_native)


def _is_reset_stack(obs: np.ndarray) -> bool:
    """A new game's frame stack: every frame a copy of the first frame."""
    return all(np.array_equal(obs[k], obs[-1]) for k in range(len(obs) - 1))


def _run(pool, actions: np.ndarray) -> list[tuple]:
    """Step a synchronous pool through ``actions (T, num_envs)``; copies of every result."""
    out = []
    for a in actions:
        obs, rew, term, trunc, info = pool.step(a)
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy(),
                    info["episode_return"].copy(), info["episode_length"].copy()))
    return out


# --- spaces, options ----------------------------------------------------------------------------
def test_spec_spaces_and_first_observation():
    assert set(GAMES) <= set(envs.list_tasks())
    with envs.make("Pong-v5", num_envs=2, seed=0) as pool:
        spec = pool.spec
        assert spec.task_id == "Pong-v5" and spec.max_episode_steps is None
        assert spec.observation_space.shape == (4, 84, 84)
        assert spec.observation_space.dtype == np.uint8
        assert spec.observation_space.low.min() == 0 and spec.observation_space.high.min() == 255
        assert spec.action_space.n == 6
        obs, info = pool.reset()
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert all(_is_reset_stack(o) for o in obs)
        assert obs[:, -1].max() > 0  # a real frame, not the zero padding ale-py uses
        obs, rew, term, trunc, info = pool.step(np.array([0, 1]))
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        assert rew.dtype == np.float64 and term.dtype == bool and trunc.dtype == bool
        assert info["episode_return"].dtype == np.float64
        np.testing.assert_array_equal(info["episode_length"], [1, 1])
        assert pool.observation_space.contains(obs[0])
    envpool = pytest.importorskip("envpool")
    ref = envpool.make_spec("Pong-v5")
    assert ref.observation_space.shape == spec.observation_space.shape
    assert ref.action_space.n == spec.action_space.n
    with envs.make("Breakout-v5", num_envs=1) as pool:
        assert pool.action_space.n == envpool.make_spec("Breakout-v5").action_space.n == 4


def test_task_kwargs_override_defaults_and_bad_options_are_named():
    with envs.make("Pong-v5", num_envs=1, stack_num=2, img_height=42, img_width=40,
                   episodic_life=False) as pool:
        assert pool.observation_space.shape == (2, 42, 40)
        assert pool.reset()[0].shape == (1, 2, 42, 40)
    with envs.make("Pong-v5", num_envs=1, gray_scale=False) as pool:
        assert pool.reset()[0].shape == (1, 4, 84, 84, 3)
    with pytest.raises(ValueError, match="frameskip.*frame_skip"):
        envs.make("Pong-v5", num_envs=1, frameskip=4)
    with pytest.raises(ValueError, match="noop_max"):
        envs.make("Pong-v5", num_envs=1, noop_max=-1)
    with pytest.raises(ValueError, match="seed"):
        envs.make("Pong-v5", num_envs=2, seed=-1)
    with pytest.raises(ValueError, match="group_size=2 impossible.*divide"):
        envs.make("Pong-v5", num_envs=3, env_batch_size=2, group_size=2)
    with pytest.raises(ValueError, match="group_size=2 impossible.*life loss"):
        envs.make("Breakout-v5", num_envs=2, autoreset="same_step", group_size=2)


# --- seeding ------------------------------------------------------------------------------------
@needs_native
def test_same_seed_same_trajectory_independent_of_engine_grouping_and_env_position():
    """Breakout: its life losses and game overs exercise the resets of every layout."""
    steps = 250
    acts = np.random.default_rng(1).integers(0, 4, (steps, 2))
    with envs.make("Breakout-v5", num_envs=2, seed=5, engine="ale") as a, \
            envs.make("Breakout-v5", num_envs=2, seed=5, group_size=1) as b, \
            envs.make("Breakout-v5", num_envs=2, seed=5, engine="native") as n, \
            envs.make("Breakout-v5", num_envs=2, seed=6) as c:
        assert a._engine.group_size == 2 and b._engine.group_size == 1
        a.reset(), b.reset(), c.reset(), n.reset()
        ra, rb = _run(a, acts), _run(b, acts)
        assert [[x.tolist() for x in r] for r in _run(n, acts)] == \
            [[x.tolist() for x in r] for r in ra]
        # env 0 of seed 6 is env 1 of seed 5: give it env 1's actions
        rc = _run(c, np.stack([acts[:, 1], acts[:, 0]], 1))
    differs, ends = False, 0
    for (oa, wa, ta, _, ea, la), (ob, wb, tb, _, eb, lb), (oc, wc, *_) in zip(ra, rb, rc):
        np.testing.assert_array_equal(oa, ob)
        np.testing.assert_array_equal(wa, wb)
        np.testing.assert_array_equal(ta, tb)
        np.testing.assert_array_equal(ea, eb)
        np.testing.assert_array_equal(la, lb)
        ends += int(ta.sum())
        np.testing.assert_array_equal(oc[0], oa[1])
        np.testing.assert_array_equal(wc[0], wa[1])
        differs |= not np.array_equal(oc[1], oa[1])  # seed 7 vs seed 6, same actions
    assert differs and ends >= 10


def test_env_i_is_ale_py_seeded_with_seed_plus_i():
    """The seeding source: ale-py's AtariVectorEnv.reset(seed=s) seeds env i with s + i."""
    from ale_py.vector_env import AtariVectorEnv

    steps = 40
    acts = np.random.default_rng(2).integers(0, 6, (steps, 2))
    ref = AtariVectorEnv("pong", 2, noop_max=30, life_loss_info=True, reward_clipping=False)
    try:
        r_obs, _ = ref.reset(seed=8)
        with envs.make("Pong-v5", num_envs=2, seed=8) as pool:
            obs, _ = pool.reset()
            np.testing.assert_array_equal(obs[:, -1], r_obs[:, -1])  # ale-py pads with zeros
            for a in acts:
                obs, rew, *_ = pool.step(a)
                r_obs, r_rew, *_ = ref.step(a)
                np.testing.assert_array_equal(obs[:, -1], r_obs[:, -1])
                np.testing.assert_array_equal(rew, r_rew)
    finally:
        ref.close()


# --- async --------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, batch, group_size", [(4, 2, None),  # None: the native engine
                                                 (4, 2, 1),  # ale-py, one env per group
                                                 (4, 2, 2), (8, 4, 2)])  # 2 groups per batch
def test_async_recv_returns_only_sent_envs_each_exactly_once(n, batch, group_size):
    rng = np.random.default_rng(0)
    with envs.make("Pong-v5", num_envs=n, env_batch_size=batch, seed=0,
                   group_size=group_size) as pool:
        assert pool._engine.group_size == (group_size or 1)
        pool.reset()
        sent = np.zeros(n, int)
        back = np.zeros(n, int)
        outstanding = set(range(n))
        pool.send(np.zeros(n, np.int64), np.arange(n))
        sent += 1
        for _ in range(40):
            obs, rew, term, trunc, info = pool.recv()
            ids = info["env_id"].tolist()
            assert len(ids) == batch and len(set(ids)) == batch
            assert set(ids) <= outstanding, (ids, outstanding)
            outstanding -= set(ids)
            back[ids] += 1
            np.testing.assert_array_equal(obs, pool._engine.slots.obs[ids])
            # groups of 2: send back what recv returned (EnvPool's loop); native or one env per
            # group: any subset of the envs not in flight
            if group_size in (None, 1):
                idle = sorted(set(range(n)) - outstanding)
                k = max(int(rng.integers(1, len(idle) + 1)), batch - len(outstanding))
                ids = sorted(rng.choice(idle, size=k, replace=False).tolist())
            pool.send(rng.integers(0, 6, len(ids)), np.array(ids))
            sent[ids] += 1
            outstanding |= set(ids)
        while len(outstanding) >= batch:
            ids = pool.recv()[4]["env_id"].tolist()
            assert set(ids) <= outstanding
            outstanding -= set(ids)
            back[ids] += 1
        np.testing.assert_array_equal(sent - back, [1 if i in outstanding else 0
                                                    for i in range(n)])


def test_partial_group_send_that_cannot_step_raises_instead_of_hanging():
    with envs.make("Pong-v5", num_envs=4, env_batch_size=2, seed=0, group_size=2) as pool:
        pool.reset()
        pool.send(np.zeros(4, np.int64))
        first = pool.recv()[4]["env_id"].copy()
        pool.send(np.zeros(1, np.int64), first[:1])   # half of a group
        second = pool.recv()[4]["env_id"].copy()      # the other group, sent whole
        assert set(second).isdisjoint(first)
        pool.send(np.zeros(1, np.int64), second[:1])  # half of the other group
        with pytest.raises(RuntimeError, match="group_size=1"):
            pool.recv()


# --- autoreset modes ----------------------------------------------------------------------------
@pytest.mark.parametrize("engine, group_size, expect", [("ale", None, 2),  # one group of both
                                                        ("ale", 1, 1),
                                                        pytest.param("native", None, 1,
                                                                     marks=needs_native)])
def test_next_step_life_loss_continues_the_game_and_game_over_restarts_it(engine, group_size,
                                                                           expect):
    """Breakout, episodic_life: each life loss terminates; the next step is the reset (reward 0,
    the same game goes on: one FIRE step, totals keep counting); after the game is over the
    next step starts a new game (reset frame stack, totals 0)."""
    rng = np.random.default_rng(3)
    with envs.make("Breakout-v5", num_envs=2, seed=3, engine=engine,
                   group_size=group_size) as pool:
        backend = pool._engine
        assert backend.group_size == expect
        obs, _ = pool.reset()
        prev = (obs.copy(), np.zeros(2), np.zeros(2, int), np.zeros(2, bool), np.zeros(2, bool))
        life_losses = games = 0
        while games < 2:
            obs, rew, term, trunc, info = pool.step(rng.integers(0, 4, 2))
            p_obs, p_ret, p_len, p_end, p_eog = prev
            for i in range(2):
                if p_end[i]:  # this step was env i's reset
                    assert rew[i] == 0 and not term[i] and not trunc[i]
                    if p_eog[i]:
                        games += 1
                        assert _is_reset_stack(obs[i])
                        assert info["episode_return"][i] == 0
                        assert info["episode_length"][i] == 0
                    else:
                        life_losses += 1
                        np.testing.assert_array_equal(obs[i][:-1], p_obs[i][1:])
                        assert info["episode_return"][i] >= p_ret[i]
                        assert info["episode_length"][i] == p_len[i] + 1
                else:
                    assert info["episode_length"][i] == p_len[i] + 1
                    assert info["episode_return"][i] >= p_ret[i] + rew[i]
            assert not (backend.end_of_game & ~term).any()
            prev = (obs.copy(), info["episode_return"].copy(), info["episode_length"].copy(),
                    term | trunc, backend.end_of_game.copy())
        assert life_losses >= 8  # 5 lives a game: 4 life losses before each game over


def test_pong_game_over_then_a_new_game_in_next_step_mode():
    rng = np.random.default_rng(0)
    with envs.make("Pong-v5", num_envs=1, seed=0) as pool:
        pool.reset()
        total, t = 0.0, 0
        while True:
            obs, rew, term, trunc, info = pool.step(rng.integers(0, 6, 1))
            total += rew[0]
            t += 1
            if term[0]:
                break
        assert pool._engine.end_of_game[0] and not trunc[0]
        assert info["episode_return"][0] == total != 0  # one side reached 21 points
        assert info["episode_length"][0] == t
        obs, rew, term, trunc, info = pool.step(rng.integers(0, 6, 1))
        assert _is_reset_stack(obs[0]) and rew[0] == 0 and not term[0]
        assert info["episode_length"][0] == 0


@pytest.mark.parametrize("engine", [NATIVE, "ale"])
@pytest.mark.parametrize("kwargs", [{},  # life losses: ale-py: one env per group
                                    {"episodic_life": False}])  # ale-py: one group, its SameStep
def test_same_step_is_next_step_with_the_reset_step_folded_in(kwargs, engine):
    """same_step's ending step returns the obs next_step returns one step later (the reset
    step), with the ending step's reward, flags and totals, and the last obs in final_obs.
    Reference: env i of a seed-s pool is env 0 of a seed-(s + i) pool."""
    n, steps = 2, (500 if kwargs else 250)  # game overs are rarer than life losses
    rng = np.random.default_rng(7)
    refs = [envs.make("Breakout-v5", num_envs=1, seed=11 + i, **kwargs) for i in range(n)]
    try:
        with envs.make("Breakout-v5", num_envs=n, seed=11, autoreset="same_step",
                       engine=engine, **kwargs) as pool:
            assert pool._engine.group_size == (n if kwargs and engine == "ale" else 1)
            pool.reset()
            for r in refs:
                r.reset()
            ends = 0
            for _ in range(steps):
                a = rng.integers(0, 4, n)
                obs, rew, term, trunc, info = pool.step(a)
                assert not (pool._engine.end_of_game & ~(term | trunc)).any()
                for i, ref in enumerate(refs):
                    r_obs, r_rew, r_term, r_trunc, r_info = ref.step(a[i:i + 1])
                    assert (rew[i], term[i], trunc[i]) == (r_rew[0], r_term[0], r_trunc[0])
                    assert info["episode_return"][i] == r_info["episode_return"][0]
                    assert info["episode_length"][i] == r_info["episode_length"][0]
                    if term[i] or trunc[i]:
                        ends += 1
                        np.testing.assert_array_equal(info["final_obs"][i], r_obs[0])
                        r_obs = ref.step(np.zeros(1, np.int64))[0]  # next_step's reset step
                    np.testing.assert_array_equal(obs[i], r_obs[0])
            assert ends >= 2
    finally:
        for r in refs:
            r.close()


@pytest.mark.parametrize("engine", [NATIVE, "ale"])
def test_disabled_raises_until_reset_and_reset_continues_after_a_life_loss(engine):
    rng = np.random.default_rng(5)
    with envs.make("Breakout-v5", num_envs=1, seed=2, autoreset="disabled",
                   engine=engine) as pool, \
            envs.make("Breakout-v5", num_envs=1, seed=2) as ref:
        pool.reset(), ref.reset()
        for _ in range(2000):
            a = rng.integers(0, 4, 1)
            obs, rew, term, trunc, info = pool.step(a)
            r_obs = ref.step(a)[0]
            np.testing.assert_array_equal(obs, r_obs)
            if term[0]:
                break
        assert term[0] and not pool._engine.end_of_game[0]  # a life lost, the game goes on
        with pytest.raises(EpisodeEndedError):
            pool.step(np.array([1]))
        obs, _ = pool.reset(env_id=[0])
        r_obs = ref.step(np.array([3]))[0]  # next_step's reset step ignores its action
        np.testing.assert_array_equal(obs[0], r_obs[0])
        assert not _is_reset_stack(obs[0])
        np.testing.assert_array_equal(pool.step(np.array([2]))[0], ref.step(np.array([2]))[0])


@pytest.mark.parametrize("engine", ["ale", NATIVE])
def test_disabled_reset_after_game_over_starts_a_new_game(engine):
    rng = np.random.default_rng(0)
    with envs.make("Breakout-v5", num_envs=2, seed=0, autoreset="disabled",
                   episodic_life=False, engine=engine) as pool:
        assert pool._engine.group_size == (2 if engine == "ale" else 1)
        pool.reset()
        term = np.zeros(2, bool)
        while not term.any():
            a = rng.integers(0, 4, 2)
            obs, rew, term, trunc, info = pool.step(a)
        i = int(np.flatnonzero(term)[0])
        assert pool._engine.end_of_game[i]
        with pytest.raises(ValueError):
            pool.step(np.zeros(2, np.int64))
        obs, _ = pool.reset(env_id=[i])
        assert _is_reset_stack(obs[0])
        pool.step(np.zeros(2, np.int64))  # both envs step again


# --- episode statistics -------------------------------------------------------------------------
@pytest.mark.parametrize("clipped_group, raw_group", [(None, 1), (1, None)])
def test_episode_totals_are_unclipped_game_score_and_steps_across_lives(clipped_group, raw_group):
    """episode_return sums the raw rewards of the whole game (all lives, reward_clip or not);
    episode_length counts its steps, the life-loss reset steps included. Env 0 of 2, on the
    native engine and on ale-py groups of one."""
    steps = 700
    acts = np.random.default_rng(4).integers(0, 6, (steps, 2))
    with envs.make("SpaceInvaders-v5", num_envs=2, seed=4, group_size=clipped_group) as clipped, \
            envs.make("SpaceInvaders-v5", num_envs=2, seed=4, reward_clip=False,
                      group_size=raw_group) as raw:
        clipped.reset(), raw.reset()
        prev_ret, prev_len, prev_end, prev_eog = 0.0, 0, False, False
        clipped_sum, big_reward, life_losses = 0.0, False, 0
        for a in acts:
            c_obs, c_rew, *_, c_info = clipped.step(a)
            obs, rew, term, trunc, info = raw.step(a)
            np.testing.assert_array_equal(c_obs, obs)  # clipping does not change the game
            assert c_rew[0] == np.sign(rew[0])
            assert c_info["episode_return"][0] == info["episode_return"][0]
            assert c_info["episode_length"][0] == info["episode_length"][0]
            ret, length = info["episode_return"][0], info["episode_length"][0]
            if prev_end and prev_eog:  # a new game
                assert (ret, length, rew[0]) == (0, 0, 0)
                clipped_sum = 0.0
            elif prev_end:  # the life-loss reset step: the game goes on
                life_losses += 1
                assert rew[0] == 0 and length == prev_len + 1 and ret >= prev_ret
            else:
                assert length == prev_len + 1 and ret == prev_ret + rew[0]
            big_reward |= rew[0] > 1
            clipped_sum += c_rew[0]
            assert ret >= clipped_sum
            prev_ret, prev_len = ret, length
            prev_end, prev_eog = term[0] or trunc[0], bool(raw._engine.end_of_game[0])
        assert big_reward and life_losses >= 1 and ret > clipped_sum


# --- equality with EnvPool ----------------------------------------------------------------------
@pytest.mark.parametrize("task, kwargs, steps", [
    ("Pong-v5", {}, 300),
    ("Breakout-v5", {"episodic_life": False}, 450),  # game overs and new games
    ("Breakout-v5", {}, 300),  # until the first life loss (the resets differ after it)
])
def test_matches_envpool_step_for_step(task, kwargs, steps):
    """ale-py and EnvPool draw reset no-ops from different random streams (module docstring), so
    same-seed trajectories differ for noop_max > 1; with noop_max=1 both reset to reset_game +
    FIRE, and frames, rewards and flags must agree exactly (new games' frame stacks included)."""
    envpool = pytest.importorskip("envpool")
    n = 2
    ep = envpool.make(task, env_type="gymnasium", num_envs=n, seed=123, noop_max=1,
                      episodic_life=kwargs.get("episodic_life", True), reward_clip=True)
    try:
        with envs.make(task, num_envs=n, seed=0, noop_max=1, **kwargs) as pool:
            obs, _ = pool.reset()
            e_obs, _ = ep.reset()
            np.testing.assert_array_equal(obs, e_obs)
            rng = np.random.default_rng(9)
            ends = 0
            for t in range(steps):
                a = rng.integers(0, pool.action_space.n, n)
                obs, rew, term, trunc, _ = pool.step(a)
                e_obs, e_rew, e_term, e_trunc, e_info = ep.step(a)
                np.testing.assert_array_equal(term, e_term, err_msg=f"step {t}")
                np.testing.assert_array_equal(trunc, e_trunc, err_msg=f"step {t}")
                np.testing.assert_array_equal(rew, e_rew, err_msg=f"step {t}")
                for i in range(n):
                    if term[i] and pool._engine.end_of_game[i]:
                        # a game over mid frame-skip: the newest frame max-pools different
                        # screens (module docstring); the older ones must agree
                        np.testing.assert_array_equal(obs[i][:-1], e_obs[i][:-1])
                    else:
                        np.testing.assert_array_equal(obs[i], e_obs[i], err_msg=f"step {t}")
                ends += int(term.sum())
                if kwargs == {} and task == "Breakout-v5" and term.any():
                    break  # EnvPool's life-loss reset (no-op + FIRE frames) differs from ours
            assert ends >= 1 or task == "Pong-v5"
            if task == "Breakout-v5" and kwargs:
                assert ends >= 2
    finally:
        ep.close()


# --- resources ----------------------------------------------------------------------------------
def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("group_size", [None, 1])
def test_close_joins_every_emulator_thread_even_with_steps_in_flight(group_size):
    before = _threads()
    pool = envs.make("Pong-v5", num_envs=2, seed=0, group_size=group_size)
    assert _threads() > before
    pool.reset()
    pool.send(np.zeros(2, np.int64))  # in flight at close
    pool.close()
    pool.close()  # idempotent
    deadline = time.monotonic() + 5
    while _threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _threads() == before
    with pytest.raises(RuntimeError):
        pool.send(np.zeros(2, np.int64))


def test_info_episode_end_marks_game_over_not_life_loss():

    rng = np.random.default_rng(0)
    saw_life_loss = False
    with envs.make("Breakout-v5", num_envs=2, seed=3) as pool:
        pool.reset()
        for _ in range(3000):
            _, _, term, trunc, info = pool.step(rng.integers(0, 4, 2))
            assert info["lives"].shape == (2,)
            life_loss = term & (info["lives"] > 0)
            assert not (info["episode_end"] & life_loss).any()
            saw_life_loss |= bool(life_loss.any())
            if info["episode_end"].any():
                assert (info["lives"][info["episode_end"]] == 0).all() or trunc.any()
                break
    assert saw_life_loss and info["episode_end"].any()


# --- the native engine ----------------------------------------------------------------------------
@needs_native
@pytest.mark.parametrize("autoreset", ["next_step", "same_step", "disabled"])
def test_native_async_subsets_follow_each_env_exactly_as_ale_py(autoreset):
    """Async pools sent random subsets: every env of the native engine takes exactly the steps
    the same env takes on ale-py (one env per group), life losses and game overs included."""
    n, batch, rounds = 6, 2, 700
    streams = np.random.default_rng(9).integers(0, 4, (n, rounds + n))

    def trajectories(engine: str) -> list[list[tuple]]:
        rng = np.random.default_rng(10)  # the same subsets for both engines
        out: list[list[tuple]] = [[] for _ in range(n)]
        count = np.zeros(n, int)
        with envs.make("Breakout-v5", num_envs=n, env_batch_size=batch, seed=21,
                       autoreset=autoreset, engine=engine,
                       **({"group_size": 1} if engine == "ale" else {})) as pool:
            pool.reset()
            idle = set(range(n))
            for _ in range(rounds):
                if idle:
                    k = max(int(rng.integers(1, len(idle) + 1)), batch - (n - len(idle)))
                    ids = sorted(int(i) for i in rng.choice(sorted(idle), k, replace=False))
                    if autoreset == "disabled":
                        ended = [i for i in ids if out[i] and (out[i][-1][2] or out[i][-1][3])]
                        if ended:
                            obs, _ = pool.reset(env_id=ended)
                            for row, i in enumerate(ended):
                                out[i].append(("reset", obs[row].tobytes()))
                    pool.send(streams[ids, count[ids]], np.array(ids))
                    count[ids] += 1
                    idle -= set(ids)
                obs, rew, term, trunc, info = pool.recv()
                for row, i in enumerate(info["env_id"].tolist()):
                    final = info["final_obs"][row].tobytes() if "final_obs" in info else b""
                    out[i].append((obs[row].tobytes(), float(rew[row]), bool(term[row]),
                                   bool(trunc[row]), float(info["episode_return"][row]),
                                   int(info["lives"][row]), final))
                    idle.add(i)
        return out

    # completion order differs (threads vs one ale-py env each), so the random subsets and the
    # steps per env differ: compare each env's common prefix
    native, ale = trajectories("native"), trajectories("ale")
    common = [min(len(a), len(b)) for a, b in zip(native, ale)]
    assert min(common) >= 100
    for a, b, m in zip(native, ale, common):
        assert a[:m] == b[:m]
    ends = sum(t[2] for env, m in zip(native, common) for t in env[:m] if len(t) > 2)
    assert ends >= 5  # life losses happened


@needs_native
def test_native_engine_options_and_unavailable_core_are_explained(monkeypatch):
    with pytest.raises(ValueError, match="group_size=2 applies to engine='ale'"):
        envs.make("Pong-v5", num_envs=2, engine="native", group_size=2)
    with pytest.raises(ValueError, match="engine='warp' must be one of"):
        envs.make("Pong-v5", num_envs=2, engine="warp")
    import ale_py

    from gmi_drl.envs import atari_native

    monkeypatch.setattr(ale_py, "__version__", "0.0.1")
    core, reason = atari_native._load()
    assert core is None and "built against ale-py" in reason and "0.0.1" in reason


@needs_native
def test_native_core_rejects_bad_ids_and_actions_before_queueing_anything():
    with envs.make("Pong-v5", num_envs=2, seed=0, engine="native") as pool:
        pool.reset()
        core = pool._engine._core
        n = pool.action_space.n
        with pytest.raises(ValueError, match="action index out of range"):
            core.send(np.array([0, 1]), np.array([0, n]))
        with pytest.raises(ValueError, match="env id out of range"):
            core.send(np.array([2]), np.array([0]))
        with pytest.raises(RuntimeError, match="nothing in flight"):
            core.wait(1)  # neither bad call queued env 0
        obs, rew, term, trunc, info = pool.step(np.array([1, 2]))  # still usable
        assert obs.shape == (2, 4, 84, 84) and info["env_id"].tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="closed"):
        core.wait(1)


@needs_native
def test_native_core_keeps_ale_py_out_of_the_global_symbol_scope():
    """ale-py's module also exports zlib and SDL functions: made global, they would capture
    the calls of libraries loaded later (pygame's SDL, zlib users)."""
    import ctypes

    with envs.make("Pong-v5", num_envs=1, engine="native") as pool:
        pool.reset()
        assert not hasattr(ctypes.CDLL(None), "SDL_CreateWindow")


@needs_native
def test_native_core_closed_from_another_thread_while_waiting_raises_not_crashes():
    import threading

    n = 16  # 256 frames a step: the first wait takes tens of ms
    pool = envs.make("Pong-v5", num_envs=n, seed=1, engine="native", num_workers=2,
                     frame_skip=256)
    pool.reset()
    core, got = pool._engine._core, {}

    def wait(key: str, count: int) -> None:
        try:
            got[key] = len(core.wait(count))
        except RuntimeError as e:
            got[key] = str(e)

    core.send(np.arange(n), np.zeros(n, np.int64))
    waiter = threading.Thread(target=wait, args=("first", n))
    waiter.start()
    time.sleep(0.001)
    wait("second", 1)  # a second waiter is refused, never starves the first
    pool.close()
    waiter.join(10)
    assert not waiter.is_alive()
    assert got["first"] in (n, "the pool was closed while waiting")
    assert "already running in another thread" in got["second"]
