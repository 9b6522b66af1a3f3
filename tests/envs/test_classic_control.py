"""Native classic control tasks (`gmi_drl.envs.classic_control`) against Gymnasium's own envs.

Each case steps a native pool and ``gymnasium.make(task_id)`` envs in lockstep with the same
actions and compares everything the pool returns; the direct `BatchedEnv` tests also compare the
float64 state itself (a float32 observation hides small state differences). Comparisons are
exact except one term of Pendulum's reward: Gymnasium squares the float32 torque with C ``powf``
(``u**2`` on a NumPy float32 scalar), which NumPy cannot vectorise, so the native ``u*u`` differs
by one float32 ulp of ``u**2`` for the rare ``u`` where ``powf`` is not correctly rounded; the
float32 term ``0.001 * u**2`` then differs by ``0.001 * 2**-22`` (the ulp of ``u**2 < 4``) plus
one float32 rounding of a value below ``0.004`` (``2**-31``): below ``1e-9`` in the reward, and
the state not at all. `_same_reward` allows exactly that and nothing else.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import gmi_drl.envs as envs
from gmi_drl.envs.classic_control import TASKS, make_batch

PENDULUM_REWARD_ATOL = 1e-9  # see the module docstring


def _same_reward(task_id: str, native: float, ref: float, action) -> bool:
    if task_id == "Pendulum-v1":
        u = np.float32(action[0])
        if u**2 != np.square(u):  # C powf (Gymnasium) vs correctly rounded (native)
            return abs(native - ref) <= PENDULUM_REWARD_ATOL
    return native == ref


def _random(space: gym.spaces.Space, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform random valid actions, one per row of ``obs``."""
    n = len(obs)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, n)
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype)


def _pump(index: int, high: int, low: int = 0):
    """Energy pumping on velocity ``obs[:, index]`` (80%) mixed with random actions (20%), so that
    episodes also end by reaching the goal, not only by the time limit."""
    def policy(space, obs, rng):
        n = len(obs)
        if isinstance(space, gym.spaces.Discrete):
            act = np.where(obs[:, index] > 0, high, low)
        else:
            act = (np.sign(obs[:, index]) * rng.uniform(0.3, 1.0, n))[:, None].astype(space.dtype)
        return np.where((rng.random(n) < 0.2).reshape(-1, *[1] * (act.ndim - 1)),
                        _random(space, obs, rng), act)
    return policy


# id, task_id, policy, pool kwargs, steps, the kinds of episode end the case must reach
CASES = [
    ("cartpole", "CartPole-v1", _random, {}, 1500, {"terminated"}),
    ("cartpole-sutton-barto", "CartPole-v1", _random, {"sutton_barto_reward": True}, 1000,
     {"terminated"}),
    ("pendulum", "Pendulum-v1", _random, {}, 1200, {"truncated"}),
    ("acrobot", "Acrobot-v1", _pump(5, 2), {}, 1500, {"terminated"}),
    ("acrobot-nips", "Acrobot-v1", _pump(5, 2), {"book_or_nips": "nips"}, 1000, set()),
    ("acrobot-noise", "Acrobot-v1", _pump(5, 2), {"torque_noise_max": 0.2}, 1000, set()),
    ("mountaincar", "MountainCar-v0", _pump(1, 2), {}, 1500, {"terminated"}),
    ("mountaincar-random", "MountainCar-v0", _random, {}, 1000, {"truncated"}),
    ("mountaincarcontinuous", "MountainCarContinuous-v0", _pump(1, 1), {}, 1500,
     {"terminated"}),
]
GYM_ATTRIBUTES = {"book_or_nips", "torque_noise_max"}  # set on the Gymnasium env, not passed


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_lockstep_with_gymnasium(case):
    _, task_id, policy, kwargs, steps, must_end = case
    n, seed = 4, 11
    gym_kwargs = {k: v for k, v in kwargs.items() if k not in GYM_ATTRIBUTES}
    refs = [gym.make(task_id, **gym_kwargs) for _ in range(n)]
    for ref in refs:
        for k in GYM_ATTRIBUTES & set(kwargs):
            setattr(ref.unwrapped, k, kwargs[k])
    rng = np.random.default_rng(seed)
    ended = {"terminated": 0, "truncated": 0}
    with envs.make(task_id, num_envs=n, seed=seed, autoreset="same_step", **kwargs) as pool:
        space = pool.observation_space
        assert space == refs[0].observation_space and pool.action_space == refs[0].action_space
        assert pool.spec.max_episode_steps == gym.registry[task_id].max_episode_steps
        obs, _ = pool.reset()
        np.testing.assert_array_equal(obs, np.stack([r.reset(seed=seed + i)[0]
                                                     for i, r in enumerate(refs)]))
        for t in range(steps):
            actions = policy(pool.action_space, obs, rng)
            obs, rew, term, trunc, info = pool.step(actions)
            assert obs.dtype == space.dtype and rew.dtype == np.float64
            assert np.all((obs >= space.low) & (obs <= space.high)), (t, obs)
            for i, ref in enumerate(refs):
                o, r, te, tr, _ = ref.step(actions[i])
                assert (term[i], trunc[i]) == (te, tr), (t, i)
                assert _same_reward(task_id, rew[i], r, actions[i]), (t, i, rew[i], r)
                if te or tr:
                    ended["terminated" if te else "truncated"] += 1
                    np.testing.assert_array_equal(info["final_obs"][i], o, err_msg=f"{t} {i}")
                    o, _ = ref.reset()
                np.testing.assert_array_equal(obs[i], o, err_msg=f"step {t} env {i}")
            obs = obs.copy()
    for kind in must_end:
        assert ended[kind] > 0, f"no episode {kind}: the case does not cover that path"


POLICIES = {"CartPole-v1": _random, "Pendulum-v1": _random, "Acrobot-v1": _pump(5, 2),
            "MountainCar-v0": _pump(1, 2), "MountainCarContinuous-v0": _pump(1, 1)}


@pytest.mark.parametrize("task_id", list(TASKS))
def test_any_subset_of_ids_in_any_order_matches_gymnasium_state(task_id):
    """The gather/scatter path: random subsets and permutations (also of all ids), direct on the
    `BatchedEnv`, comparing the float64 state with the Gymnasium env's; an episode that ends is
    reset with ``seed=None`` (continuing its generator)."""
    n, seed, steps = 5, 3, 600
    env = make_batch(task_id, n)
    refs = [gym.make(task_id) for _ in range(n)]
    ids = np.arange(n)
    obs = env.reset(ids, [seed + i for i in range(n)])
    np.testing.assert_array_equal(obs, [r.reset(seed=seed + i)[0] for i, r in enumerate(refs)])
    last = obs.copy()
    rng = np.random.default_rng(0)
    for t in range(steps):
        sub = rng.permutation(n)[:rng.integers(1, n + 1)]
        actions = POLICIES[task_id](env.action_space, last[sub], rng)
        obs, rew, term, trunc = (x.copy() for x in env.step(sub, actions))
        assert not trunc.any()
        state = env.get_state(sub)
        for k, i in enumerate(sub):
            o, r, te, _, _ = refs[i].step(actions[k])
            np.testing.assert_array_equal(state[k], np.asarray(refs[i].unwrapped.state, np.float64),
                                          err_msg=f"step {t} env {i}")
            np.testing.assert_array_equal(obs[k], o, err_msg=f"step {t} env {i}")
            assert te == term[k] and _same_reward(task_id, rew[k], r, actions[k]), (t, i)
        last[sub] = obs
        # episodes end on termination or on a short time limit of this test's own
        done = sub[term | (rng.random(len(sub)) < 0.01)]
        if len(done):
            last[done] = env.reset(done, [None] * len(done))
            np.testing.assert_array_equal(last[done], [refs[i].reset()[0] for i in done])


@pytest.mark.parametrize("task_id", list(TASKS))
def test_reset_matches_gymnasium_for_many_seeds(task_id):
    """First and continued resets of 4000 seeds: observations and float64 states (enough draws
    to see Acrobot's float32 cos/sin of its float32 reset state)."""
    n = 4000
    env, ref, ids = make_batch(task_id, n), gym.make(task_id), np.arange(n)
    for seeds in (list(range(1000, 1000 + n)), [None] * n):
        obs = env.reset(ids, seeds).copy()
        state = env.get_state(ids)
        refs_obs, refs_state = [], []
        for i in ids:  # replay each seed's generator as far as env i's has gone
            if seeds[i] is not None:
                o, _ = ref.reset(seed=seeds[i])
            else:
                ref.reset(seed=1000 + int(i))
                o, _ = ref.reset()
            refs_obs.append(o)
            refs_state.append(np.asarray(ref.unwrapped.state, np.float64))
        np.testing.assert_array_equal(obs, refs_obs)
        np.testing.assert_array_equal(state, refs_state)


@pytest.mark.parametrize("task_id", list(TASKS))
def test_same_seed_same_trajectory_other_seed_other(task_id):
    def run(seed):
        rng = np.random.default_rng(0)
        out = []
        with envs.make(task_id, num_envs=3, seed=seed) as pool:
            obs, _ = pool.reset()
            out.append(obs.copy())
            for _ in range(50):
                out.append(pool.step(_random(pool.action_space, obs, rng))[0].copy())
        return np.stack(out)
    a, b, c = run(5), run(5), run(6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[0], c[0])
    np.testing.assert_array_equal(a[0, 1:], c[0, :-1])  # env i of seed 6 is env i+1 of seed 5


def test_registry_limits_and_bad_keywords():
    assert set(TASKS) <= set(envs.list_tasks())
    for task_id, (_, limit) in TASKS.items():
        assert limit == gym.registry[task_id].max_episode_steps
    with pytest.raises(ValueError, match="sutton_barto"):
        envs.make("CartPole-v1", num_envs=2, sutton_barto=True)
    with pytest.raises(ValueError, match="book_or_nips"):
        envs.make("Acrobot-v1", num_envs=2, book_or_nips="paper")


def test_box_actions_are_taken_as_float32():
    rng = np.random.default_rng(1)
    a64 = rng.uniform(-1, 1, (200, 2, 1))
    results = []
    for actions in (a64, a64.astype(np.float32)):
        with envs.make("MountainCarContinuous-v0", num_envs=2, seed=0) as pool:
            pool.reset()
            results.append([pool.step(a)[0].copy() for a in actions])
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("book_or_nips", ["book", "nips"])
def test_acrobot_derivative_equals_the_source_on_random_states(book_or_nips):
    """`Acrobot._dsdt` against ``AcrobotEnv._dsdt`` on 10000 random states, exactly: one rounding
    off anywhere in the derivative mostly vanishes in the RK4 sum, so check it directly."""
    n = 10000
    rng = np.random.default_rng(0)
    high = np.array([np.pi, np.pi, 4 * np.pi, 9 * np.pi])
    states = rng.uniform(-high, high, (n, 4))
    torques = rng.choice([-1.0, 0.0, 1.0], n)
    native = make_batch("Acrobot-v1", 1, book_or_nips=book_or_nips)
    derivs = native._dsdt(np.ascontiguousarray(states.T), torques, np.empty((4, n)))
    ref = gym.make("Acrobot-v1").unwrapped
    ref.book_or_nips = book_or_nips
    expected = [ref._dsdt(np.append(s, a))[:4] for s, a in zip(states, torques)]
    np.testing.assert_array_equal(derivs.T, expected)
