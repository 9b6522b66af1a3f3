"""The dm_env face (`gmi_drl.envs.dm`): batched TimeSteps step for step against the Gymnasium
face on the same seeds (terminations, truncations, the FIRST after each LAST), its specs, and
its refusals."""

import numpy as np
import pytest

from gmi_drl import envs

dm_env = pytest.importorskip("dm_env", reason="the dm_env face needs the dm-env package")

FIRST, MID, LAST = (int(t) for t in (dm_env.StepType.FIRST, dm_env.StepType.MID,
                                     dm_env.StepType.LAST))


@pytest.mark.parametrize("task_id, kwargs, steps", [
    ("CartPole-v1", {}, 120),                          # terminations
    ("Pendulum-v1", {"max_episode_steps": 7}, 30),     # truncations only
    ("Hopper-v5", {"max_episode_steps": 40}, 100),     # the MuJoCo core: both
])
def test_the_dm_face_steps_as_the_gymnasium_face(task_id, kwargs, steps):
    n, rng = 4, np.random.default_rng(0)
    gym = envs.make_vec(task_id, n, seed=3, autoreset_mode="NextStep", **kwargs)
    with envs.make_dm(task_id, n, seed=3, **kwargs) as dm:
        space = gym.action_space
        ts = dm.reset()
        obs, _ = gym.reset()
        assert (ts.step_type == FIRST).all() and (ts.reward == 0).all()
        assert (ts.discount == 1).all()
        np.testing.assert_array_equal(ts.observation, obs)
        ended = np.zeros(n, bool)
        seen = {FIRST: 0, LAST: 0, "truncated": 0, "terminated": 0}
        for _ in range(steps):
            if space.dtype.kind == "f":
                action = rng.uniform(space.low, space.high).astype(space.dtype)
            else:
                action = rng.integers(0, 2, n)
            ts = dm.step(action)
            obs, reward, terminated, truncated, _ = gym.step(action)
            np.testing.assert_array_equal(ts.observation, obs)
            np.testing.assert_allclose(ts.reward, reward.astype(np.float32))
            assert ts.reward.dtype == np.float32 and ts.discount.dtype == np.float32
            expected = np.where(ended, FIRST, np.where(terminated | truncated, LAST, MID))
            np.testing.assert_array_equal(ts.step_type, expected)
            np.testing.assert_array_equal(ts.discount, np.where(terminated, 0.0, 1.0))
            ended = terminated | truncated
            seen[FIRST] += int((ts.step_type == FIRST).sum())
            seen[LAST] += int(ended.sum())
            seen["terminated"] += int(terminated.sum())
            seen["truncated"] += int((truncated & ~terminated).sum())
        assert seen[FIRST] > 0 and seen[LAST] > 0
        assert seen["truncated" if task_id == "Pendulum-v1" else "terminated"] > 0
    gym.close()


def test_specs_are_one_envs():
    with envs.make_dm("Hopper-v5", 2, seed=0) as dm:
        assert isinstance(dm, dm_env.Environment)  # what dm_env users check
        obs, act = dm.observation_spec(), dm.action_spec()
        assert obs.shape == (11,) and obs.dtype == np.float64
        assert isinstance(act, dm_env.specs.BoundedArray) and act.shape == (3,)
        np.testing.assert_array_equal(act.minimum, -1.0)
        assert dm.discount_spec().maximum == 1.0 and dm.reward_spec().dtype == np.float32
        act.validate(np.zeros(3, np.float32))
    with envs.make_dm("CartPole-v1", 2, seed=0) as dm:
        assert isinstance(dm.action_spec(), dm_env.specs.DiscreteArray)
        assert dm.action_spec().num_values == 2


def test_bad_input_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="autoreset= is set by the face"):
        envs.make_dm("CartPole-v1", 2, autoreset="same_step")
    with pytest.raises(ValueError, match="num_envs=0 must be an int >= 1"):
        envs.make_dm("CartPole-v1", 0)
    with envs.make_dm("CartPole-v1", 2, seed=0) as dm:
        with pytest.raises(RuntimeError, match="step\\(\\) before reset\\(\\)"):
            dm.step(np.zeros(2, np.int64))
        dm.reset()
        with pytest.raises(ValueError):
            dm.step(np.zeros(3, np.int64))  # one action too many
