"""The C++ env template (csrc/env_template.h): its example Pendulum against Gymnasium's step for
step, on every face, and the errors of envs that break the template's contract."""

import os

import gymnasium as gym
import numpy as np
import pytest

from gmi_drl import envs
from gmi_drl.envs import cpp_env

try:
    from gmi_drl.envs import _cpp_examples
except ImportError as e:  # not built
    _cpp_examples = None
    pytestmark = pytest.mark.skip(reason=f"gmi_drl.envs._cpp_examples is not built ({e})")

TASK = cpp_env.EXAMPLE_TASK
_MASK = 2**64 - 1


def _next_seed(seed: int) -> int:
    """gmi_drl::next_seed (SplitMix64), in Python integers."""
    z = (seed + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _reset_state(seed: int) -> np.ndarray:
    """The example Pendulum's reset state ``[theta, theta_dot]`` for a reset with ``seed``."""
    a = _next_seed(seed)
    b = _next_seed(a)
    return np.array([-np.pi + (np.pi - -np.pi) * ((a >> 11) * 2.0**-53),
                     -1.0 + (1.0 - -1.0) * ((b >> 11) * 2.0**-53)])


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_pendulum_steps_as_gymnasiums_from_the_same_state():
    n, seed = 3, 11
    gyms = [gym.make("Pendulum-v1").unwrapped for _ in range(n)]
    rng = np.random.default_rng(0)
    with envs.make(TASK, n, num_workers=2, seed=seed) as pool:
        obs, _ = pool.reset()
        seeds = [seed + i for i in range(n)]
        for env, s in zip(gyms, seeds):
            env.reset(seed=0)
            env.state = _reset_state(s)
        np.testing.assert_array_equal(obs, [env._get_obs() for env in gyms])
        for t in range(1, 201):
            actions = rng.uniform(-2.5, 2.5, (n, 1)).astype(np.float32).clip(-2, 2)
            obs, reward, term, trunc, info = pool.step(actions)
            want = [env.step(a) for env, a in zip(gyms, actions)]
            np.testing.assert_array_equal(obs, [w[0] for w in want])
            np.testing.assert_allclose(reward, [w[1] for w in want], rtol=0, atol=1e-9)
            assert not term.any()
            assert trunc.all() == (t == 200) and info["episode_length"].tolist() == [t] * n
        # next_step autoreset: the next step starts each env's episode from its chain's next seed
        obs, reward, term, trunc, info = pool.step(np.zeros((n, 1), np.float32))
        for i, env in enumerate(gyms):
            env.state = _reset_state(_next_seed(seeds[i]))
            np.testing.assert_array_equal(obs[i], env._get_obs())
        assert not reward.any() and info["episode_length"].tolist() == [0] * n


def _native_trajectory(n, seed, actions):
    with envs.make(TASK, n, num_workers=2, seed=seed) as pool:
        out = [pool.reset()[0].copy()]
        out += [pool.step(a)[0].copy() for a in actions]
    return np.array(out)


def test_every_face_runs_the_cpp_env_as_the_pool_does():
    from gmi_drl.envs.sb3 import make_vec_env

    n, seed = 4, 5
    actions = np.random.default_rng(1).uniform(-2, 2, (6, n, 1)).astype(np.float32)
    want = _native_trajectory(n, seed, actions)

    with envs.make(TASK, n, env_batch_size=2, num_workers=2, seed=seed) as pool:  # send/recv
        pool.reset()
        got = np.zeros_like(want[1:])
        for k in range(len(actions)):
            pool.send(actions[k])
            for _ in range(2):
                obs, _, _, _, info = pool.recv()
                got[k, info["env_id"]] = obs
        np.testing.assert_array_equal(got, want[1:])

    vec = envs.make_vec(TASK, n)
    try:
        got = [vec.reset(seed=seed)[0].copy()] + [vec.step(a)[0].copy() for a in actions]
        assert vec.single_action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    finally:
        vec.close()
    np.testing.assert_array_equal(got, want)

    venv = make_vec_env(TASK, n_envs=n, seed=seed)
    try:
        got = [venv.reset().copy()]
        for a in actions:
            venv.step_async(a)
            got.append(venv.step_wait()[0].copy())
    finally:
        venv.close()
    np.testing.assert_array_equal(got, want)

    dm = envs.make_dm(TASK, n, seed=seed)
    try:
        got = [dm.reset().observation] + [dm.step(a).observation for a in actions]
        assert dm.action_spec().shape == (1,)
    finally:
        dm.close()
    np.testing.assert_array_equal(got, want)


def test_same_step_autoreset_options_and_time_limit():
    with envs.make(TASK, 2, num_workers=2, autoreset="same_step", max_episode_steps=3,
                   g=9.81) as pool:
        assert pool.spec.max_episode_steps == 3
        first, _ = pool.reset()
        first = first.copy()
        for _ in range(3):
            obs, _, _, trunc, info = pool.step(np.zeros((2, 1), np.float32))
        assert trunc.all() and info["episode_length"].tolist() == [3, 3]
        assert not np.array_equal(info["final_obs"], obs)  # obs: the new episode's first
    with pytest.raises(ValueError, match=r"does not take the option\(s\) \['gravity'\]"):
        envs.make(TASK, 2, gravity=9.8)
    with pytest.raises(ValueError, match="must be a number"):
        envs.make(TASK, 2, g="high")


@pytest.mark.parametrize("fault, message", [
    ("obs_too_long", r"env_id \d: wrote 4 obs value\(s\) but the spec's obs has 3"),
    ("obs_too_short", r"env_id \d: step wrote 2 of the 3 obs value\(s\) the spec declares"),
    ("action_too_wide", r"env_id \d: step read action\[1\] but the spec's action has 1 value"),
])
def test_an_env_that_breaks_its_spec_is_named_and_leaves_no_thread(fault, message):
    task = f"CppFault-{fault}-v0"
    envs.register_cpp(task, f"gmi_drl.envs._cpp_examples:{fault}")
    before = _threads()
    pool = envs.make(task, 4, num_workers=3)
    assert _threads() == before + 2  # queue_workers: the caller is the third thread
    pool.reset()
    with pytest.raises(RuntimeError, match=message):
        for _ in range(5):
            pool.step(np.zeros((4, 1), np.float32))
    assert _threads() == before  # the core stopped its workers before raising
    with pytest.raises(RuntimeError, match=message):  # the pool stays poisoned
        pool.step(np.zeros((4, 1), np.float32))
    pool.close()


def test_bad_resets_and_bad_actions_are_refused():
    envs.register_cpp("CppFault-reset-v0", "gmi_drl.envs._cpp_examples:reset_too_short")
    before = _threads()
    pool = envs.make("CppFault-reset-v0", 2, num_workers=2)
    with pytest.raises(RuntimeError, match=r"env_id 0: reset wrote 2 of the 3 obs value"):
        pool.reset()
    assert _threads() == before
    pool.close()
    with envs.make(TASK, 2, num_workers=2) as pool:
        pool.reset()
        with pytest.raises(ValueError, match=r"actions have shape \(2, 2\), expected \(2, 1\)"):
            pool.step(np.zeros((2, 2), np.float32))
    envs.register_cpp("CppFault-spec-v0", "gmi_drl.envs._cpp_examples:bad_spec")
    with pytest.raises(ValueError, match="invalid EnvSpec: a Box action needs action_low and "
                                         "action_high of one equal, non-zero size"):
        envs.make("CppFault-spec-v0", 2, num_workers=2)
    assert _threads() == before
    with pytest.raises(ValueError, match="cannot be loaded"):
        envs.register_cpp("Nope-v0", "gmi_drl.envs._no_such_module")
    with pytest.raises(ValueError, match="is not a C\\+\\+ env template module"):
        envs.register_cpp("Nope-v0", "gmi_drl.envs.cpp_env")


def test_worker_threads_take_the_affinity_asked():
    allowed = sorted(os.sched_getaffinity(0))
    with envs.make(TASK, 2, num_workers=2, thread_affinity=allowed[-1:]) as pool:
        pool.reset()
        pool.step(np.zeros((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"names core\(s\) \[4096\]"):
        envs.make(TASK, 2, thread_affinity=[4096])


def test_a_cpp_env_registered_in_the_script_trains_in_gmi_processes(tmp_path):
    """docs/add-a-cpp-env.md: a task registered with `register_cpp` where the run starts trains
    through `train`, in GMI processes too (the registration travels with the run)."""
    from gmi_drl.config import preset
    from gmi_drl.train import train

    envs.register_cpp("Pendulum-cpp-test", "gmi_drl.envs._cpp_examples:pendulum")
    cfg = preset("classic", "Pendulum-cpp-test", "ppo")
    cfg.gmi.num_gmis, cfg.env.num_envs, cfg.algo.num_steps = 2, 4, 16
    cfg.total_timesteps = 2 * cfg.batch_size
    cfg.compile, cfg.log.tensorboard, cfg.run_dir = False, False, str(tmp_path / "run")
    result = train(cfg)
    assert result.global_step == 2 * cfg.batch_size
    assert len(result.weight_digests) == 2 and len(set(result.weight_digests)) == 1
