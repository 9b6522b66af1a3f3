"""The Gymnasium and Stable-Baselines3 faces of a pool: step for step the same as the libraries'
own vector envs on the same seeds, their wrappers chain, and bad input is named."""

import contextlib

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


def test_make_vec_takes_gymnasiums_arguments_and_get_attr_answers_as_sync_vector_env():
    ours = envs.make_vec("Pendulum-v1", vectorization_mode="sync",
                         vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    ref = _gym("Pendulum-v1", 1, AutoresetMode.SAME_STEP)
    assert ours.num_envs == 1 and ours.autoreset_mode == ref.autoreset_mode
    assert ours.spec.id == ref.spec.id == "Pendulum-v1"
    for name in ("observation_space", "action_space", "render_mode"):
        assert ours.get_attr(name) == ref.get_attr(name) == ours.call(name), name
    assert ours.get_attr("spec")[0].id == "Pendulum-v1"
    assert ours.get_attr("spec")[0] is not gym.registry["Pendulum-v1"]  # a copy to change
    with pytest.raises(AttributeError, match="no per-env attribute or method 'g'"):
        ours.get_attr("g")
    with pytest.raises(AttributeError, match="no per-env attribute or method 'step'"):
        ours.call("step", 0)
    with pytest.raises(AttributeError, match="no per-env attribute 'g' to set"):
        ours.set_attr("g", [5.0])
    with pytest.raises(NotImplementedError, match="--video"):
        ours.call("render")
    ours.close()
    ref.close()
    with pytest.raises(ValueError, match=r"vectorization_mode='vector_entry_point'.*Pong-v5\); "
                       r"vector_kwargs \['context'\] are not taken.*wrappers= wraps each single "
                       r"env.*render_mode='human': gmi-drl pools do not render"):
        envs.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point",
                      vector_kwargs={"context": "spawn"}, wrappers=[gym.wrappers.ClipAction],
                      render_mode="human")
    with pytest.warns(UserWarning, match="raw frames.*AtariVectorEnv.*gmi-drl's Pong-v5"):
        envs.make_vec("ALE/Pong-v5", 1).close()


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
    with pytest.raises(ValueError, match="expected a floating-point or integer dtype"):
        v.step(np.zeros((2, 3), bool))
    v.step(np.array([[0, 1, -2], [3, 0, 0]]))  # ints fit a float Box, clipped as floats are
    with pytest.raises(ValueError, match="reset options"):
        v.reset(options={"noise": 1})
    with pytest.raises(NotImplementedError, match="--video"):
        v.render()
    v.close()
    with pytest.raises(RuntimeError, match="closed"):
        v.step(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("face", ["pool", "gymnasium", "sb3"])
def test_a_copy_or_pickle_is_refused_by_name_and_the_env_steps_on(face):
    """A copy would share (shallow) or duplicate (deep) the worker processes' shared memory;
    before, ``deepcopy`` failed inside the C++ pool or on a lambda, naming neither."""
    import copy
    import pickle

    pytest.importorskip("stable_baselines3")
    from gmi_drl.envs.sb3 import make_vec_env

    make = {"pool": lambda: envs.make("CartPole-v1", 2, seed=0),
            "gymnasium": lambda: envs.make_vec("CartPole-v1", 2, seed=0),
            "sb3": lambda: make_vec_env("CartPole-v1", 2, seed=0)}[face]
    constructor = {"pool": "make", "gymnasium": "make_vec", "sb3": "sb3.make_vec_env"}[face]
    with contextlib.closing(make()) as env:
        env.reset()
        for how in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match=rf"cannot be copied or pickled: .* "
                                                rf"gmi_drl\.envs\.{constructor}\("):
                how(env)
        action = np.zeros(2, np.int64)
        env.step(action)


def test_a_dropped_face_frees_its_worker_processes_at_once():
    """Without close(), as Gymnasium's vector envs: the last reference going frees the pool
    (no reference cycle left to the cycle collector)."""
    import gc
    import multiprocessing as mp

    gc.disable()
    try:
        before = {p.pid for p in mp.active_children()}
        v = envs.make_vec("Reacher-v5", 2)  # a generic env: worker processes
        v.reset(seed=0)
        workers = [p for p in mp.active_children() if p.pid not in before]
        assert len(workers) == 2
        del v
        for p in workers:
            p.join(timeout=10)
        assert not [p for p in workers if p.is_alive()]
    finally:
        gc.enable()


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
            assert sorted(info["episode"]) == sorted(ref_info["episode"]) == ["l", "r", "t"]
            for k in "rl":
                np.testing.assert_array_equal(info["episode"][k], ref_info["episode"][k])
                assert info["episode"][k].dtype == ref_info["episode"][k].dtype
            seen += 1
    assert seen > 5


def test_seed_at_construction_is_the_first_resets_seed():
    """The README's ``make_vec(task, n, seed=s)``: its first ``reset()`` equals Gymnasium's
    ``reset(seed=s)``, and a first ``reset(seed=s)`` keeps the pool it was built with."""
    ours, ref = envs.make_vec("CartPole-v1", 3, seed=5), _gym("CartPole-v1", 3,
                                                              AutoresetMode.NEXT_STEP)
    np.testing.assert_array_equal(ours.reset()[0], ref.reset(seed=5)[0])
    again = envs.make_vec("CartPole-v1", 3, seed=5)
    pool = again.pool
    np.testing.assert_array_equal(again.reset(seed=5)[0], ref.reset(seed=5)[0])
    assert again.pool is pool


def _after_seed_7(seed):
    """obs of ``reset(seed=seed)`` after ``reset(seed=7)`` and a step, and whether the pool
    was kept."""
    env = envs.make_vec("CartPole-v1", 3)
    env.reset(seed=7)
    env.step(np.array([0, 1, 0]))
    pool = env.pool
    return env.reset(seed=seed)[0], env.pool is pool


def test_seed_lists_with_none_are_reproducible():
    """All ``None``: every env continues, as in Gymnasium; some ``None``: those envs get seeds
    drawn from the list's ints, the same for the same list."""
    ref = _gym("CartPole-v1", 3, AutoresetMode.NEXT_STEP)
    ref.reset(seed=7)
    ref.step(np.array([0, 1, 0]))
    obs, kept = _after_seed_7([None] * 3)
    np.testing.assert_array_equal(obs, ref.reset(seed=[None] * 3)[0])
    assert kept
    first, kept = _after_seed_7([None, 4, None])
    assert not kept
    np.testing.assert_array_equal(first, _after_seed_7([None, 4, None])[0])
    np.testing.assert_array_equal(first[1], gym.make("CartPole-v1").reset(seed=4)[0])
    assert not np.array_equal(first, _after_seed_7([None, 5, None])[0])


def test_faces_name_what_they_set_themselves_and_bad_sizes():
    with pytest.raises(ValueError, match="num_envs=0 must be an int >= 1$"):
        envs.make_vec("CartPole-v1", 0)
    with pytest.raises(ValueError, match="num_envs=2.0 must be an int >= 1"):
        envs.make_vec("CartPole-v1", 2.0)
    with pytest.raises(ValueError, match="autoreset= is set by the face: use autoreset_mode="):
        envs.make_vec("CartPole-v1", 2, autoreset="same_step")
    with pytest.raises(ValueError, match="env_batch_size= is set by the face"):
        envs.make_vec("CartPole-v1", 4, env_batch_size=2)
    with pytest.raises(ValueError, match=r"one of \['NextStep', 'SameStep', 'Disabled'\]"):
        envs.make_vec("CartPole-v1", 2, autoreset_mode="same_step")
    with pytest.raises(gym.error.ResetNeeded, match="reset"):
        envs.make_vec("CartPole-v1", 2).step(np.array([0, 1]))


def test_a_seed_the_engine_refuses_leaves_the_face_usable():
    env = envs.make_vec("Pong-v5", 2)
    env.reset(seed=3)
    with pytest.raises(ValueError, match="outside"):
        env.reset(seed=2**31)
    assert env.step(np.array([0, 1]))[0].shape == (2, 4, 84, 84)  # the old pool, still open
    assert env.reset(seed=1)[0].shape == (2, 4, 84, 84)
    env.close()


@pytest.mark.parametrize("engine", ["native", "numpy", "gymnasium"])
def test_a_seed_no_engine_takes_is_refused_before_the_pool_is_replaced(engine):
    """Negative seeds used to be taken, and failed only at the new pool's first reset: the
    face had closed its good pool by then, and every later reset failed too."""
    env = envs.make_vec("CartPole-v1", 2, engine=engine)
    env.reset(seed=3)
    for bad in (-1, 2**63 - 1):
        with pytest.raises(ValueError, match=r"must lie in \[0, 2\*\*63\)"):
            env.reset(seed=bad)
    assert env.step(np.array([0, 1]))[0].shape == (2, 4)  # the old pool, still open
    assert env.reset()[0].shape == (2, 4)
    env.close()


@pytest.mark.warp
def test_a_pool_of_tensors_comes_back_as_numpy_with_float64_rewards():
    """The warp engine returns torch tensors with ``tensors=True`` (as on CUDA); the face gives
    NumPy, rewards float64 as Gymnasium's, equal to the NumPy outputs of the same pool."""
    from gmi_drl.envs.warp.pool import warp_error

    if warp_error():
        pytest.skip(warp_error())
    out = []
    for tensors in (True, False):
        env = envs.make_vec("BallBalance-gmi-v0", 2, seed=0, tensors=tensors)
        assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP  # the engine's only one
        obs, _ = env.reset()
        step = env.step(np.full((2, 3), 0.5, np.float32))
        assert all(isinstance(x, np.ndarray) for x in (obs, *step[:4]))
        assert step[1].dtype == np.float64 and step[2].dtype == np.bool_
        out.append((obs, *step[:4]))
        env.close()
    for x, y in zip(*out):
        np.testing.assert_array_equal(x, y)


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


def test_sb3_wrappers_chain_and_ppo_trains_on_the_face(tmp_path, monkeypatch):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecFrameStack, VecNormalize

    from gmi_drl.envs.sb3 import make_vec_env

    # (no VecMonitor: the face reports episodes as Monitor-wrapped envs do, and VecMonitor
    # warns over it as over SB3's own make_vec_env)
    env = VecNormalize(VecFrameStack(make_vec_env("Hopper-v5", 4, seed=1), 2), gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=64, n_epochs=2, seed=1, device="cpu")
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path))  # (else learn leaves a directory in /tmp)
    model.learn(total_timesteps=1024)
    assert model.num_timesteps == 1024 and len(model.ep_info_buffer) > 0
    assert all(np.isfinite(e["r"]) for e in model.ep_info_buffer)
    env.close()


def test_sb3_face_explains_what_it_cannot_do():
    from gmi_drl.envs.sb3 import make_vec_env

    env = make_vec_env("CartPole-v1", 2, seed=0)
    env.reset()
    assert env.get_attr("render_mode") == [None, None]
    with pytest.raises(AttributeError, match="no per-env method 'render'"):
        env.env_method("render")
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(2,\)"):
        env.step(np.zeros(3, np.int64))
    env.set_options({"x": 1})
    with pytest.raises(ValueError, match="reset options"):
        env.reset()
    assert env.reset().shape == (2, 4)  # the refused options are dropped
    assert env.get_attr("spec")[0].id == "CartPole-v1" and env.has_attr("spec")
    assert env.get_attr("observation_space", 1) == [env.observation_space]
    assert isinstance(env.get_attr("metadata")[0], dict)
    env.close()


def test_sb3_face_refuses_what_it_sets_and_steps_only_after_reset():
    from gmi_drl.envs.sb3 import make_vec_env

    with pytest.raises(ValueError, match="num_envs=0 must be an int >= 1$"):
        make_vec_env("CartPole-v1", 0)
    with pytest.raises(ValueError, match="env_batch_size= is set by the face"):
        make_vec_env("CartPole-v1", 4, env_batch_size=2)
    with pytest.raises(ValueError, match="autoreset= is set by the face"):
        make_vec_env("CartPole-v1", 2, autoreset="next_step")
    env = make_vec_env("CartPole-v1", 2, seed=0)
    pool = env.pool
    with pytest.raises(RuntimeError, match="step before reset"):
        env.step(np.array([0, 1]))
    env.reset()
    assert env.pool is pool  # seeded at construction: the first reset keeps the pool
    with pytest.raises(RuntimeError, match="step_wait\\(\\) without step_async"):
        env.step_wait()
    env.step_async(np.array([0, 1]))
    with pytest.raises(RuntimeError, match="step_async\\(\\) twice"):
        env.step_async(np.array([0, 1]))
    env.reset()  # as DummyVecEnv: the step not waited for is dropped
    obs, _, dones, _ = env.step(np.array([0, 1]))
    assert obs.shape == (2, 4) and not dones.any()
    env.close()
    env = make_vec_env("Pong-v5", 2, seed=0)
    env.seed(2**31)  # beyond ALE's seeds
    with pytest.raises(ValueError, match="outside"):
        env.reset()
    assert env.reset().shape == (2, 4, 84, 84)  # the refused seeds were dropped, the pool kept
    assert env.step(np.array([0, 1]))[0].shape == (2, 4, 84, 84)
    env.close()


def test_sb3_make_vec_env_writes_monitor_files_as_sb3s_and_names_what_it_refuses(tmp_path):
    import csv
    import json

    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
    from stable_baselines3.common.vec_env import SubprocVecEnv

    from gmi_drl.envs.sb3 import make_vec_env

    ours = make_vec_env("CartPole-v1", 2, seed=3, start_index=5, monitor_dir=str(tmp_path / "o"),
                        vec_env_cls=SubprocVecEnv, monitor_kwargs={"allow_early_resets": True})
    ref = sb3_make_vec_env("CartPole-v1", 2, seed=3, start_index=5,
                           monitor_dir=str(tmp_path / "r"))
    ours.reset(), ref.reset()
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = rng.integers(0, 2, 2)
        ours.step(a), ref.step(a)
    ours.close(), ref.close()
    for name in ("5.monitor.csv", "6.monitor.csv"):
        mine, theirs = ((tmp_path / d / name).read_text().splitlines() for d in "or")
        assert json.loads(mine[0][1:]).keys() == json.loads(theirs[0][1:]).keys()
        rows = [[row[:2] for row in csv.reader(lines[1:])] for lines in (mine, theirs)]
        assert rows[0] == rows[1] and len(rows[0]) > 5  # header r,l,t, then r and l alike
    with pytest.raises(ValueError, match=r"wrapper_class wraps each single env.*vec_env_cls=.*"
                       r"DummyVecEnv and SubprocVecEnv only.*monitor_kwargs \['overide_existing'"
                       r"\]: not Monitor's; monitor_kwargs info_keywords.*\['g'\] given both"):
        make_vec_env("Pendulum-v1", 2, wrapper_class=gym.wrappers.ClipAction, vec_env_cls=int,
                     monitor_kwargs={"info_keywords": ("is_success",), "overide_existing": False},
                     env_kwargs={"g": 5.0}, g=2.0)
    with pytest.raises(ValueError, match="takes a task id, not a callable; register"):
        make_vec_env(lambda: gym.make("CartPole-v1"), 2)
    env = make_vec_env("Pendulum-v1", 1, seed=0, env_kwargs={"g": 5.0})  # env_kwargs: the task's
    ref = gym.make("Pendulum-v1", g=5.0)
    np.testing.assert_array_equal(env.reset()[0], ref.reset(seed=0)[0])
    a = np.array([[1.5]], np.float32)
    np.testing.assert_array_equal(env.step(a)[0][0], ref.step(a[0])[0])
    env.close()


def test_sb3_evaluation_counts_whole_atari_games():
    """``env_is_wrapped(Monitor)`` is True, so ``evaluate_policy`` takes the face's
    ``infos[i]["episode"]`` (whole games, unclipped score) rather than ``dones`` (lives)."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    from gmi_drl.envs.sb3 import make_vec_env

    class Random:
        def __init__(self):
            self.rng = np.random.default_rng(0)

        def predict(self, obs, state=None, episode_start=None, deterministic=False):
            return self.rng.integers(0, 4, len(obs)), None

    def games(n):
        env = make_vec_env("Breakout-v5", 1, seed=0)
        model, found, dones = Random(), [], 0
        obs = env.reset()
        while len(found) < n:
            obs, _, done, infos = env.step(model.predict(obs)[0])
            dones += int(done[0])
            if "episode" in infos[0]:
                found.append((infos[0]["episode"]["r"], infos[0]["episode"]["l"]))
        return found, dones

    env = make_vec_env("Breakout-v5", 1, seed=0)
    assert env.env_is_wrapped(Monitor) == [True]
    rewards, lengths = evaluate_policy(Random(), env, n_eval_episodes=2,
                                       return_episode_rewards=True, warn=True)
    want, dones = games(2)
    assert dones > 2  # life losses end SB3 episodes: counting dones would give per-life sums
    assert list(zip(rewards, lengths)) == want


def test_make_vec_of_an_env_spec_asks_for_its_id():
    with pytest.raises(TypeError, match="pass spec.id"):
        envs.make_vec(gym.spec("CartPole-v1"), 2)
