"""Native MuJoCo locomotion tasks against the official Gymnasium v5 envs, step for step.

Both sides run the same MuJoCo library with the same calls, so the comparisons are exact
(``np.array_equal`` / ``==``), with no tolerance.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import gmi_drl.envs as envs
from gmi_drl.envs import mujoco_locomotion as ml

TASKS = ["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5", "Swimmer-v5",
         "InvertedPendulum-v5"]
# > 1000: HalfCheetah and Swimmer never terminate, so this also covers the pool's time limit
# truncating every env once and the reset that follows.
LOCKSTEP_STEPS = 1010


def _actions(space: gym.spaces.Box, n: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, *shape) float32`` uniform actions within ``space`` (float32 rounding stays inside:
    the bounds themselves are float32 values)."""
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(space.dtype)


def _lockstep(task_id: str, n: int, steps: int, seed: int, **kwargs) -> int:
    """Step a pool and ``n`` Gymnasium envs with the same actions; assert every result equal.

    Returns the number of episodes that ended (terminated or truncated).
    """
    gym_kwargs = {k: v for k, v in kwargs.items() if k != "engine"}
    refs = [gym.make(task_id, **gym_kwargs) for _ in range(n)]
    rng = np.random.default_rng(seed)
    ends = 0
    with envs.make(task_id, num_envs=n, num_workers=2, seed=seed, autoreset="same_step",
                   **kwargs) as pool:  # the thread engine where it is built, for its tasks
        assert pool.observation_space == refs[0].observation_space
        assert pool.action_space == refs[0].action_space
        obs, _ = pool.reset()
        ref_obs = np.stack([r.reset(seed=seed + i)[0] for i, r in enumerate(refs)])
        np.testing.assert_array_equal(obs, ref_obs, err_msg=f"{task_id} first reset")
        for t in range(steps):
            actions = _actions(pool.action_space, n, rng)
            obs, reward, terminated, truncated, info = pool.step(actions)
            for i, ref in enumerate(refs):
                where = f"{task_id} env {i} step {t}"
                o, r, te, tr, _ = ref.step(actions[i])
                assert (reward[i], terminated[i], truncated[i]) == (r, te, tr), where
                if te or tr:
                    ends += 1
                    np.testing.assert_array_equal(info["final_obs"][i], o, err_msg=where)
                    o, _ = ref.reset()
                np.testing.assert_array_equal(obs[i], o, err_msg=where)
    for ref in refs:
        ref.close()
    return ends


@pytest.mark.parametrize("task_id", TASKS)
def test_lockstep_with_gymnasium(task_id):
    ends = _lockstep(task_id, n=4, steps=LOCKSTEP_STEPS, seed=3)
    assert ends >= 4  # episodes ended and were reset on both sides (all envs truncate at 1000)


@pytest.mark.parametrize("task_id", ["Hopper-v5", "HalfCheetah-v5", "Ant-v5", "Humanoid-v5"])
def test_numpy_engine_lockstep_with_gymnasium(task_id):
    """The vectorised NumPy engine, which runs these tasks where the C++ core is not built."""
    ends = _lockstep(task_id, n=4, steps=LOCKSTEP_STEPS, seed=3, engine="numpy")
    assert ends >= 4


@pytest.mark.parametrize("task_id, kwargs", [
    ("Hopper-v5", dict(ctrl_cost_weight=0.5, reset_noise_scale=0.1, healthy_reward=2.0,
                       exclude_current_positions_from_observation=False)),
    ("Walker2d-v5", dict(terminate_when_unhealthy=False, healthy_z_range=(0.9, 1.5))),
    ("HalfCheetah-v5", dict(forward_reward_weight=2.0, frame_skip=3)),
    ("Swimmer-v5", dict(exclude_current_positions_from_observation=False)),
    ("InvertedPendulum-v5", dict(reset_noise_scale=0.1)),
    ("Ant-v5", dict(include_cfrc_ext_in_observation=False, contact_force_range=(-0.5, 2.0),
                    healthy_z_range=(0.3, 0.9), main_body="torso")),
    ("Humanoid-v5", dict(include_cinert_in_observation=False, include_cfrc_ext_in_observation=False,
                         contact_cost_range=(-np.inf, 1e-3))),
])
def test_lockstep_with_gymnasium_keywords(task_id, kwargs):
    _lockstep(task_id, n=2, steps=150, seed=9, **kwargs)


@pytest.mark.parametrize("task_id", ["Hopper-v5", "Ant-v5"])
def test_unordered_subsets_and_reseeding_match_gymnasium(task_id):
    """The `BatchedEnv` itself: subsets of envs in any order, explicit and repeated seeds."""
    n = 4
    cls, _ = ml.TASKS[task_id]
    env = cls(num_envs=n, num_threads=2)
    refs = [gym.make(task_id) for _ in range(n)]
    rng = np.random.default_rng(1)
    seeds = [5, 6, 5, 7]  # envs 0 and 2 share a seed: identical start
    obs = env.reset(np.arange(n), seeds).copy()
    for i in range(n):
        np.testing.assert_array_equal(obs[i], refs[i].reset(seed=seeds[i])[0])
    np.testing.assert_array_equal(obs[0], obs[2])
    for t in range(400):
        ids = rng.permutation(n)[:rng.integers(1, n + 1)]
        actions = _actions(env.action_space, len(ids), rng)
        obs, reward, terminated, truncated = env.step(ids, actions)
        assert not truncated.any()
        ended = []
        for k, i in enumerate(ids):
            o, r, te, tr, _ = refs[i].step(actions[k])
            assert (reward[k], terminated[k]) == (r, te), f"{task_id} env {i} step {t}"
            np.testing.assert_array_equal(obs[k], o, err_msg=f"{task_id} env {i} step {t}")
            if te or tr:
                ended.append(int(i))
        if t % 97 == 96:  # re-seed some envs mid-episode, continue the generator of others
            ended = sorted(set(ended) | {3, 1})
        if ended:
            new_seeds = [100 + t if i == 3 else None for i in ended]
            obs = env.reset(np.array(ended[::-1]), new_seeds[::-1])
            for k, i in enumerate(ended[::-1]):
                ref_obs, _ = refs[i].reset(seed=new_seeds[::-1][k])
                np.testing.assert_array_equal(obs[k], ref_obs, err_msg=f"{task_id} reset {i}")
    env.close()
    env.close()  # idempotent


@pytest.mark.parametrize("task_id", TASKS)
def test_deterministic_per_seed_and_obs_in_space(task_id):
    def rollout(seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0)
        with envs.make(task_id, num_envs=3, num_workers=2, seed=seed) as pool:
            obs, _ = pool.reset()
            observations, rewards = [obs.copy()], []
            for _ in range(60):
                obs, reward, *_ = pool.step(_actions(pool.action_space, 3, rng))
                assert obs.shape == (3, *pool.observation_space.shape)
                assert obs.dtype == pool.observation_space.dtype == np.float64
                assert reward.dtype == np.float64
                assert all(pool.observation_space.contains(o) for o in obs)
                observations.append(obs.copy())
                rewards.append(reward.copy())
        return np.stack(observations), np.stack(rewards)

    obs_a, rew_a = rollout(21)
    obs_b, rew_b = rollout(21)
    obs_c, _ = rollout(22)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    assert not np.array_equal(obs_a[0], obs_c[0])
    np.testing.assert_array_equal(obs_a[0, 1:], obs_c[0, :-1])  # env i of seed 22 = env i+1 of 21
    assert len({o.tobytes() for o in obs_a[0]}) == 3  # envs of one pool start differently


def test_registered_natively_with_gymnasium_limits():
    assert set(TASKS) <= set(envs.list_tasks())
    assert set(ml.TASKS) == set(TASKS)
    for task_id in TASKS:
        with envs.make(task_id, num_envs=1) as pool:
            # a generic-path pool would report None: the wrapped env applies its own limit
            assert pool.spec.max_episode_steps == gym.envs.registry[task_id].max_episode_steps
            assert pool.spec.max_episode_steps == 1000


def test_bad_arguments_raise():
    with pytest.raises(TypeError):
        ml.HopperBatch(2, 1, no_such_option=1)
    with pytest.raises(FileNotFoundError):
        ml.HopperBatch(2, 1, xml_file="no_such_model.xml")
    for bad in (dict(num_envs=0), dict(num_threads=0), dict(frame_skip=0)):
        with pytest.raises(ValueError):
            ml.SwimmerBatch(**{"num_envs": 2, "num_threads": 1, **bad})
    env = ml.SwimmerBatch(2, 1)
    with pytest.raises(ValueError):
        env.reset(np.arange(2), [0])


def test_model_warnings_are_python_warnings_not_a_log_file(tmp_path, monkeypatch):
    """MuJoCo 4.0 warns that Gymnasium's half_cheetah.xml uses the deprecated settotalmass; the
    warning comes as a Python warning, once per process by default, with no MUJOCO_LOG.TXT left
    in the current directory and MuJoCo's own handler back in place after the load."""
    import mujoco

    monkeypatch.chdir(tmp_path)
    before = mujoco.get_mju_user_warning()
    with pytest.warns(ml.MujocoModelWarning, match="half_cheetah.xml: .*settotalmass"):
        ml.HalfCheetahBatch(2, 1)
    assert mujoco.get_mju_user_warning() is before
    bad = tmp_path / "bad.xml"
    bad.write_text('<mujoco><worldbody><body><geom type="sphere"/></body></worldbody></mujoco>')
    with pytest.raises(ValueError, match="size 0 must be positive"):
        ml.HopperBatch(2, 1, xml_file=str(bad))
    assert mujoco.get_mju_user_warning() is before
    assert list(tmp_path.iterdir()) == [bad]


def _per_env_trajectories(pool, rounds: int) -> dict[int, list]:
    """Drive ``pool`` with EnvPool's send/recv loop; env ``i``'s action at its ``k``-th step is
    a fixed function of ``(i, k)``. Returns each env's (obs, reward, terminated, truncated)."""
    space, n, b = pool.action_space, pool.num_envs, pool.env_batch_size
    steps, out = np.zeros(n, np.int64), {i: [] for i in range(n)}

    def actions_for(ids):
        return np.stack([np.random.default_rng([i, steps[i]]).uniform(space.low, space.high)
                         .astype(space.dtype) for i in ids])

    pool.reset()
    for start in range(0, n, b):
        ids = np.arange(start, start + b)
        pool.send(actions_for(ids), ids)
    for _ in range(rounds):
        obs, rew, term, trunc, info = pool.recv()
        ids = info["env_id"].copy()
        for j, i in enumerate(ids):
            out[i].append((obs[j].copy(), rew[j], term[j], trunc[j]))
            steps[i] += 1
        pool.send(actions_for(ids), info["env_id"])
    return out


def test_async_pool_each_env_follows_its_own_actions():
    """In an async MuJoCo pool every env's trajectory depends only on the actions sent to it, so
    it equals the synchronous pool's for the same per-env actions, resets included."""
    with envs.make("Hopper-v5", num_envs=8, env_batch_size=4, num_workers=2, seed=3,
                   autoreset="same_step") as pool:
        got = _per_env_trajectories(pool, rounds=400)
    with envs.make("Hopper-v5", num_envs=8, seed=3, autoreset="same_step") as pool:
        want = _per_env_trajectories(pool, rounds=200)
    ended = 0
    for i in range(8):
        k = min(len(got[i]), len(want[i]))
        assert k >= 150, f"env {i} stepped only {k} times"
        for (o1, r1, te1, tr1), (o2, r2, te2, tr2) in zip(got[i][:k], want[i][:k]):
            np.testing.assert_array_equal(o1, o2)
            assert (r1, te1, tr1) == (r2, te2, tr2)
            ended += te1 | tr1
    assert ended > 0  # the comparison covered autoresets too
