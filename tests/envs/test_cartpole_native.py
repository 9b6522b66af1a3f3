"""CartPole-v1's pool in C++ (`gmi_drl.envs.cartpole_native`): Gymnasium's trajectories, the
NumPy engine's results in every mode, and `EnvPool`'s contract (errors before anything is sent,
in-flight rules, closed pools)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import gmi_drl.envs as envs
from gmi_drl.envs import cartpole_native as cn
from gmi_drl.envs.stepper import EpisodeEndedError

pytestmark = pytest.mark.skipif(cn.UNAVAILABLE is not None, reason=f"{cn.UNAVAILABLE}")


@pytest.mark.parametrize("sutton_barto_reward", [False, True])
def test_lockstep_with_gymnasium(sutton_barto_reward):
    """> DRAW_BLOCK episodes per env: the block-wise reset draws continue each env's stream."""
    n, seed = 4, 7
    refs = [gym.make("CartPole-v1", sutton_barto_reward=sutton_barto_reward) for _ in range(n)]
    rng = np.random.default_rng(0)
    ends = np.zeros(n, int)
    with envs.make("CartPole-v1", num_envs=n, seed=seed, autoreset="same_step",
                   sutton_barto_reward=sutton_barto_reward) as pool:
        assert isinstance(pool, cn.CartPoleNativePool)
        assert pool.observation_space == refs[0].observation_space
        obs, _ = pool.reset()
        np.testing.assert_array_equal(obs, [r.reset(seed=seed + i)[0] for i, r in enumerate(refs)])
        for t in range(2000):
            actions = rng.integers(0, 2, n)
            obs, rew, term, trunc, info = pool.step(actions)
            for i, ref in enumerate(refs):
                o, r, te, tr, _ = ref.step(int(actions[i]))
                assert (rew[i], term[i], trunc[i]) == (r, te, tr), f"env {i} step {t}"
                if te or tr:
                    ends[i] += 1
                    np.testing.assert_array_equal(info["final_obs"][i], o)
                    o, _ = ref.reset()
                np.testing.assert_array_equal(obs[i], o, err_msg=f"env {i} step {t}")
                np.testing.assert_array_equal(pool.get_state(i), ref.unwrapped.state)
    assert (ends > cn.DRAW_BLOCK).all()


def _trajectory(engine: str, autoreset: str, n: int, batch: int) -> list:
    out = []
    with envs.make("CartPole-v1", num_envs=n, env_batch_size=batch, seed=3, engine=engine,
                   autoreset=autoreset) as pool:
        rng = np.random.default_rng(1)
        obs, info = pool.reset()
        out.append(obs.copy())
        ids = np.arange(n)
        for _ in range(1500):
            res = pool.step(rng.integers(0, 2, len(ids)), ids)
            obs, rew, term, trunc, info = res
            out.extend(np.copy(x) for x in res[:4])
            out.extend(np.copy(info[k]) for k in sorted(info))
            ids = info["env_id"]
            if autoreset == "disabled" and (term | trunc).any():
                out.append(pool.reset(ids[term | trunc].copy())[0].copy())
    return out


@pytest.mark.parametrize("autoreset", ["next_step", "same_step", "disabled"])
@pytest.mark.parametrize("n, batch", [(4, 4), (8, 3)])
def test_equals_numpy_engine(autoreset, n, batch):
    native, numpy = (_trajectory(e, autoreset, n, batch) for e in ("native", "numpy"))
    assert len(native) == len(numpy)
    for k, (a, b) in enumerate(zip(native, numpy)):
        np.testing.assert_array_equal(a, b, err_msg=f"item {k}")


@pytest.mark.parametrize("bad, match", [
    (np.zeros(3, np.int64), "shape"), (np.zeros((4, 1), np.int64), "shape"),
    (np.zeros(4), "dtype"), (np.array([0, 2, 0, 0]), "outside"),
    (np.array([0, -1, 0, 0]), "outside"), (np.array([0, 1, 0, 1], np.int8), None),
])
def test_bad_actions_raise_before_anything_is_sent(bad, match):
    with envs.make("CartPole-v1", num_envs=4) as pool:
        pool.reset()
        if match is None:  # any integer dtype is fine
            pool.step(bad)
            return
        with pytest.raises(ValueError, match=match):
            pool.step(bad)
        # nothing was stepped by the failed call, and the pool stays usable
        assert pool.step([1, 1, 1, 1])[4]["episode_length"].tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("env_id, match", [
    ([4], "out of range"), ([-1], "out of range"), ([1, 1], "repeats"),
    ([0.5], "ints"), ([], "ints"),
])
def test_bad_env_ids_and_in_flight_rules(env_id, match):
    with envs.make("CartPole-v1", num_envs=4, env_batch_size=1) as pool:
        pool.reset()
        with pytest.raises(ValueError, match=match):
            pool.send(np.zeros(len(env_id), np.int64), env_id)
        with pytest.raises(RuntimeError, match="in flight"):
            pool.recv()
        pool.send(np.array([1]), [2])
        with pytest.raises(ValueError, match="in flight"):
            pool.send(np.array([1]), [2])
        with pytest.raises(ValueError, match="in flight"):
            pool.reset([2])
        info = pool.recv()[4]
        assert info["env_id"].tolist() == [2] and info["episode_length"].tolist() == [1]
        with pytest.raises(ValueError):
            info["env_id"][0] = 0  # read-only: the pool reuses it


def test_disabled_autoreset_raises_until_reset_and_closed_pool_raises():
    with envs.make("CartPole-v1", num_envs=2, autoreset="disabled") as pool:
        pool.reset()
        term = np.zeros(2, bool)
        while not term.any():
            _, _, term, trunc, _ = pool.step(np.ones(2, np.int64))  # push right until it falls
        with pytest.raises(EpisodeEndedError, match="autoreset is disabled"):
            pool.step(np.ones(2, np.int64))
        ended = np.flatnonzero(term)
        obs, info = pool.reset(ended)
        assert obs.shape == (len(ended), 4) and info["env_id"].tolist() == ended.tolist()
        pool.step(np.ones(2, np.int64))
    with pytest.raises(RuntimeError, match="closed"):
        pool.step(np.ones(2, np.int64))
    pool.close()  # idempotent
    never_reset = envs.make("CartPole-v1", num_envs=2)
    never_reset.close()
    with pytest.raises(RuntimeError, match="pool is closed"):  # not "never reset"
        never_reset.step(np.ones(2, np.int64))


def test_engine_and_keyword_errors():
    with pytest.raises(ValueError, match="engine='gpu'"):
        envs.make("CartPole-v1", num_envs=2, engine="gpu")
    with pytest.raises(ValueError, match="no_such_option"):
        envs.make("CartPole-v1", num_envs=2, no_such_option=1)
    with envs.make("CartPole-v1", num_envs=2, engine="numpy") as pool:
        assert type(pool) is envs.EnvPool
