"""The Gymnasium and Stable-Baselines3 faces of a pool: step for step the same as the libraries'
own vector envs on the same seeds, their wrappers chain, and bad input is named."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AutoresetMode

import gmi_drl.envs as envs

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]


def _gym(task, n, mode, **kw):
    return gym.make_vec(task, n, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": mode}, **kw)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("task, steps, info", [("CartPole-v1", 400, "equivalence"),
                                               ("Hopper-v5", 400, "skip")])
def test_gymnasium_face_matches_make_vec_step_for_step(task, steps, info, mode):
    """Gymnasium's ``data_equivalence`` (values, dtypes, shapes) of every reset and step;
    Hopper's per-step infos (x_position, reward terms) are Gymnasium's env's, not the pool's.
    (Gymnasium has no checker for vector envs: ``check_environments_match`` takes single ones.)"""
    ours, ref = envs.make_vec(task, 3, autoreset_mode=mode), _gym(task, 3, mode)
    assert ours.metadata["autoreset_mode"] is mode
    assert (ours.single_observation_space, ours.single_action_space, ours.observation_space,
            ours.action_space) == (ref.single_observation_space, ref.single_action_space,
                                   ref.observation_space, ref.action_space)
    ref.action_space.seed(5)
    got, want = ours.reset(seed=5), ref.reset(seed=5)
    assert data_equivalence(got[0], want[0])
    assert info == "skip" or data_equivalence(got[1], want[1])
    ended = 0
    for _ in range(steps):
        a = ref.action_space.sample()
        got, want = ours.step(a), ref.step(a)
        assert data_equivalence(got[:4], want[:4])
        if info == "equivalence":
            assert data_equivalence(got[4], want[4])
        ended += int((want[2] | want[3]).sum())
    assert ended > 5
    ours.close()
    ref.close()


@pytest.mark.parametrize("mode", MODES)
def test_same_step_final_observations_follow_gymnasiums_conventions(mode):
    ours, ref = envs.make_vec("CartPole-v1", 4, autoreset_mode=mode), _gym("CartPole-v1", 4, mode)
    ours.reset(seed=1)
    ref.reset(seed=1)
    ref.action_space.seed(1)
    ended = 0
    for _ in range(300):
        a = ref.action_space.sample()
        _, _, term, trunc, info = ours.step(a)
        _, _, _, _, ref_info = ref.step(a)
        assert sorted(info) == sorted(ref_info)
        if "_final_obs" in ref_info:
            np.testing.assert_array_equal(info["_final_obs"], ref_info["_final_obs"])
            np.testing.assert_array_equal(info["_final_info"], ref_info["_final_info"])
            for i in np.flatnonzero(ref_info["_final_obs"]):
                np.testing.assert_array_equal(info["final_obs"][i], ref_info["final_obs"][i])
            ended += int(ref_info["_final_obs"].sum())
    assert (ended > 10) == (mode is AutoresetMode.SAME_STEP)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("game, kwargs, ale_kwargs", [
    ("Pong", {}, {"life_loss_info": True}),
    ("Breakout", {"episodic_life": False}, {"life_loss_info": False}),  # game overs inside
])
def test_atari_face_matches_ale_pys_vector_env(game, kwargs, ale_kwargs, mode):
    """``gymnasium.make_vec`` of an ALE id is ale-py's AtariVectorEnv; ale-py pads a new
    game's frame stack with zeros (the pool, as EnvPool, with the first frame), so the newest
    frame is compared. With lives, the pool's ``episodic_life`` continues the game after a life
    loss where ale-py starts a new one: the comparison turns it off."""
    import ale_py

    gym.register_envs(ale_py)
    ref = gym.make_vec(f"ALE/{game}-v5", 2, vectorization_mode="vector_entry_point",
                       noop_max=30, reward_clipping=True, repeat_action_probability=0.0,
                       autoreset_mode=mode, **ale_kwargs)
    ours = envs.make_vec(f"{game}-v5", 2, autoreset_mode=mode, **kwargs)
    try:
        obs, _ = ours.reset(seed=8)
        ref_obs, _ = ref.reset(seed=8)
        np.testing.assert_array_equal(obs[:, -1], ref_obs[:, -1])
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(700 if game == "Breakout" else 200):
            a = rng.integers(0, ours.single_action_space.n, 2)
            obs, rew, term, trunc, info = ours.step(a)
            ref_obs, ref_rew, ref_term, ref_trunc, ref_info = ref.step(a)
            np.testing.assert_array_equal(obs[:, -1], ref_obs[:, -1])
            for x, y in ((rew, ref_rew), (term, ref_term), (trunc, ref_trunc),
                         (info["lives"], ref_info["lives"])):
                np.testing.assert_array_equal(x, y)
            ends += int((term | trunc).sum())
        assert ends >= (4 if game == "Breakout" else 0)
    finally:
        ours.close()
        ref.close()


def test_gymnasium_wrappers_chain_and_give_what_they_give_on_make_vec():
    """CleanRL's continuous-control stack on both; NormalizeObservation/Reward keep running
    statistics, so equal outputs mean equal inputs at every step."""
    from gymnasium.wrappers import vector as wv

    def stack(env):
        env = wv.RecordEpisodeStatistics(wv.ClipAction(env))
        return wv.NormalizeReward(wv.NormalizeObservation(env), gamma=0.99)

    ours, ref = stack(envs.make_vec("Hopper-v5", 4)), stack(_gym("Hopper-v5", 4,
                                                                  AutoresetMode.NEXT_STEP))
    obs, _ = ours.reset(seed=3)
    ref_obs, _ = ref.reset(seed=3)
    np.testing.assert_allclose(obs, ref_obs)
    rng, episodes = np.random.default_rng(0), 0
    for _ in range(300):
        a = rng.normal(0, 1.5, (4, 3)).astype(np.float32)  # outside [-1, 1]: ClipAction clips
        obs, rew, term, trunc, info = ours.step(a)
        ref_obs, ref_rew, *_, ref_info = ref.step(a)
        np.testing.assert_allclose(obs, ref_obs, rtol=1e-12)
        np.testing.assert_allclose(rew, ref_rew, rtol=1e-12)
        if "_episode" in ref_info:
            np.testing.assert_array_equal(info["_episode"], ref_info["_episode"])
            np.testing.assert_allclose(info["episode"]["r"], ref_info["episode"]["r"])
            np.testing.assert_array_equal(info["episode"]["l"], ref_info["episode"]["l"])
            episodes += int(ref_info["_episode"].sum())
    assert episodes >= 4


def test_seeds_as_int_list_and_again():
    ours, ref = envs.make_vec("CartPole-v1", 3), _gym("CartPole-v1", 3, AutoresetMode.NEXT_STEP)
    for seed in (7, [3, 11, 5], 7):  # the second and third reset reseed a used pool
        np.testing.assert_array_equal(ours.reset(seed=seed)[0], ref.reset(seed=seed)[0])
        for a in np.random.default_rng(1).integers(0, 2, (30, 3)):
            np.testing.assert_array_equal(ours.step(a)[0], ref.step(a)[0])
    with pytest.raises(ValueError, match="seed has 2 items, expected one per env"):
        ours.reset(seed=[1, 2])
    unseeded = envs.make_vec("CartPole-v1", 3)
    assert unseeded.observation_space.contains(unseeded.reset()[0])  # seeds of its own


def test_disabled_mode_resets_the_masked_envs():
    ours = envs.make_vec("CartPole-v1", 2, autoreset_mode=AutoresetMode.DISABLED)
    ref = _gym("CartPole-v1", 2, AutoresetMode.DISABLED)
    ours.reset(seed=2)
    ref.reset(seed=2)
    done = np.zeros(2, bool)
    while not done.any():
        obs, _, term, trunc, _ = ours.step(np.array([1, 1]))
        ref_obs, *_ = ref.step(np.array([1, 1]))
        done = term | trunc
    with pytest.raises(ValueError, match="reset"):
        ours.step(np.array([1, 1]))
    obs, _ = ours.reset(options={"reset_mask": done})
    ref_obs, _ = ref.reset(options={"reset_mask": done})
    np.testing.assert_array_equal(obs, ref_obs)
    with pytest.raises(ValueError, match="reset_mask"):
        ours.reset(options={"reset_mask": np.zeros(2, bool)})
    with pytest.raises(ValueError, match="seeding a subset"):
        ours.reset(seed=1, options={"reset_mask": done})


def test_bad_input_is_named():
    v = envs.make_vec("Hopper-v5", 2)
    v.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(2, 2\), expected \(2, 3\)"):
        v.step(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="expected a floating-point dtype"):
        v.step(np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="reset options"):
        v.reset(options={"noise": 1})
    with pytest.raises(NotImplementedError, match="--video"):
        v.render()
    v.close()
    with pytest.raises(RuntimeError, match="closed"):
        v.step(np.zeros((2, 3), np.float32))


def test_copies_unless_asked_not_to():
    owned, views = envs.make_vec("CartPole-v1", 2), envs.make_vec("CartPole-v1", 2, copy=False)
    a, _ = owned.reset(seed=0)
    b, _ = views.reset(seed=0)
    a2 = owned.step(np.array([0, 1]))[0]
    b2 = views.step(np.array([0, 1]))[0]
    assert a2 is not a and not np.array_equal(a, a2)  # the first observation kept its values
    assert b2 is b  # the one buffer, refilled


def test_episode_statistics_match_record_episode_statistics():
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    ours = envs.make_vec("CartPole-v1", 3, episode_statistics=True)
    ref = RecordEpisodeStatistics(_gym("CartPole-v1", 3, AutoresetMode.NEXT_STEP))
    ours.reset(seed=4)
    ref.reset(seed=4)
    seen = 0
    for a in np.random.default_rng(2).integers(0, 2, (200, 3)):
        info, ref_info = ours.step(a)[4], ref.step(a)[4]
        assert ("_episode" in info) == ("_episode" in ref_info)
        if "_episode" in info:
            np.testing.assert_array_equal(info["_episode"], ref_info["_episode"])
            np.testing.assert_array_equal(info["episode"]["r"], ref_info["episode"]["r"])
            np.testing.assert_array_equal(info["episode"]["l"], ref_info["episode"]["l"])
            seen += 1
    assert seen > 5


# --- Stable-Baselines3 ----------------------------------------------------------------------------
sb3 = pytest.importorskip("stable_baselines3")


@pytest.mark.parametrize("task", ["CartPole-v1", "Hopper-v5"])
def test_sb3_face_matches_dummy_vec_env_step_for_step(task):
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    from gmi_drl.envs.sb3 import make_vec_env

    ours, ref = make_vec_env(task, 3, seed=4), sb3_make_vec_env(task, n_envs=3, seed=4)
    np.testing.assert_array_equal(ours.reset(), ref.reset())
    rng, episodes = np.random.default_rng(0), 0
    for _ in range(500):
        a = (rng.integers(0, 2, 3) if task == "CartPole-v1"
             else rng.uniform(-1, 1, (3, 3)).astype(np.float32))
        obs, rew, done, infos = ours.step(a)
        ref_obs, ref_rew, ref_done, ref_infos = ref.step(a)
        np.testing.assert_array_equal(obs, ref_obs)
        np.testing.assert_array_equal(rew, ref_rew)
        np.testing.assert_array_equal(done, ref_done)
        assert rew.dtype == ref_rew.dtype == np.float32
        for info, ref_info in zip(infos, ref_infos):
            assert info["TimeLimit.truncated"] == ref_info["TimeLimit.truncated"]
            assert ("terminal_observation" in info) == ("terminal_observation" in ref_info)
            if "terminal_observation" in info:
                np.testing.assert_array_equal(info["terminal_observation"],
                                              ref_info["terminal_observation"])
                assert (info["episode"]["r"], info["episode"]["l"]) == (
                    ref_info["episode"]["r"], ref_info["episode"]["l"])
                episodes += 1
    assert episodes > 10
    ours.close()


def test_sb3_wrappers_chain_and_ppo_trains_on_the_face():
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor, VecNormalize

    from gmi_drl.envs.sb3 import make_vec_env

    env = VecNormalize(VecMonitor(make_vec_env("Hopper-v5", 4, seed=1)), gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=2, seed=1, device="cpu")
    model.learn(total_timesteps=1024)
    assert model.num_timesteps == 1024 and len(model.ep_info_buffer) > 0
    assert all(np.isfinite(e["r"]) for e in model.ep_info_buffer)
    env.close()


def test_sb3_face_explains_what_it_cannot_do():
    from gmi_drl.envs.sb3 import make_vec_env

    env = make_vec_env("CartPole-v1", 2, seed=0)
    assert env.get_attr("render_mode") == [None, None]
    with pytest.raises(AttributeError, match="no per-env method 'render'"):
        env.env_method("render")
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(2,\)"):
        env.step(np.zeros(3, np.int64))
    env.set_options({"x": 1})
    with pytest.raises(ValueError, match="reset options"):
        env.reset()
    env.close()
