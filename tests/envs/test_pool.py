"""The pool's contract over the generic (worker process) path: semantics, input checks, failures."""

from __future__ import annotations

import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

import gmi_drl.envs as envs
from gmi_drl.envs.stepper import EpisodeEndedError
from gmi_drl.envs.workers import EnvWorkerError
from tests.envs.conftest import CounterEnv
from tests.procs import shm_entries, shm_left

envs.register("Counter-test", CounterEnv, episode_len=5)
envs.register("CounterFail-test", CounterEnv, episode_len=100, fail_at=3)
envs.register("CounterFailLong-test", CounterEnv, episode_len=100, fail_at=2,
              fail_padding=200_000)  # a traceback larger than a pipe's buffer (64 KiB)
envs.register("CartPoleGeneric-test", "CartPole-v1")  # Gymnasium's own, in worker processes


def _act(values) -> np.ndarray:
    return np.asarray(values, np.float64)


def test_generic_path_matches_gymnasium_step_for_step():
    seed, n, steps = 7, 3, 1200
    rng = np.random.default_rng(0)
    refs = [gym.make("CartPole-v1") for _ in range(n)]
    ref_obs = [r.reset(seed=seed + i)[0] for i, r in enumerate(refs)]
    with envs.make("CartPoleGeneric-test", num_envs=n, num_workers=2, seed=seed,
                   autoreset="same_step") as pool:
        assert len({int(p.pid) for p in pool._engine._procs}) == 2  # really the worker path
        obs, _ = pool.reset()
        np.testing.assert_array_equal(obs, np.stack(ref_obs))
        for _ in range(steps):
            a = rng.integers(0, 2, n)
            obs, rew, term, trunc, info = pool.step(a)
            for i, r in enumerate(refs):
                o, rr, te, tr, _ = r.step(int(a[i]))
                assert (rew[i], term[i], trunc[i]) == (rr, te, tr)
                if te or tr:
                    np.testing.assert_array_equal(info["final_obs"][i], o)
                    o, _ = r.reset()
                np.testing.assert_array_equal(obs[i], o)


def test_seeds_are_seed_plus_env_id_and_deterministic():
    with envs.make("Counter-test", num_envs=4, seed=10) as a, \
            envs.make("Counter-test", num_envs=4, seed=10) as b, \
            envs.make("Counter-test", num_envs=4, seed=11) as c:
        oa, ob, oc = a.reset()[0][:, 2].copy(), b.reset()[0][:, 2].copy(), c.reset()[0][:, 2]
    np.testing.assert_array_equal(oa, ob)
    assert not np.array_equal(oa, oc)
    for i in range(4):
        ref = CounterEnv()
        assert ref.reset(seed=10 + i)[0][2] == oa[i]
    np.testing.assert_array_equal(oa[1:], oc[:-1])  # env i of seed 11 is env i+1 of seed 10


def test_async_recv_returns_only_sent_envs_each_once():
    with envs.make("Counter-test", num_envs=8, env_batch_size=2, num_workers=2,
                   autoreset="disabled") as pool:
        pool.reset()
        sent = np.array([6, 1, 3, 4])
        pool.send(_act([1.0, 2.0, 3.0, 4.0]), sent)
        got = []
        for _ in range(2):
            obs, rew, _, _, info = pool.recv()
            ids = info["env_id"].copy()
            got.extend(ids.tolist())
            for k, i in enumerate(ids):
                expect = {6: 1.0, 1: 2.0, 3: 3.0, 4: 4.0}[int(i)]
                assert rew[k] == expect and obs[k, 0] == 1 and obs[k, 1] == expect
        assert sorted(got) == sorted(sent.tolist())
        with pytest.raises(RuntimeError, match="in flight"):
            pool.recv()  # nothing left in flight: must not block forever


def test_many_async_rounds_step_every_env_exactly_once_per_action():
    n, batch, episode_len = 8, 3, 5
    rng = np.random.default_rng(1)
    with envs.make("Counter-test", num_envs=n, env_batch_size=batch, num_workers=2,
                   autoreset="next_step") as pool:
        obs, _ = pool.reset()
        last_t = obs[:, 0].copy()
        sent = rng.uniform(-1, 1, n)
        pool.send(_act(sent), np.arange(n))
        returned = np.zeros(n, int)
        for _ in range(200):
            obs, rew, term, trunc, info = pool.recv()
            ids = info["env_id"].copy()
            for k, i in enumerate(ids):
                if last_t[i] == episode_len:  # next_step: this step only reset the env
                    assert obs[k, 0] == 0 and rew[k] == 0
                else:  # stepped exactly once, with the action sent for it
                    assert obs[k, 0] == last_t[i] + 1 and rew[k] == sent[i]
                last_t[i] = obs[k, 0]
            returned[ids] += 1
            sent[ids] = rng.uniform(-1, 1, len(ids))
            pool.send(_act(sent[ids]), ids)
    assert returned.sum() == 200 * batch and (returned > 0).all()


def test_autoreset_next_step():
    with envs.make("Counter-test", num_envs=2) as pool:  # the default, as EnvPool's
        assert pool.autoreset is envs.AutoresetMode.NEXT_STEP
        pool.reset()
        for t in range(1, 6):
            obs, rew, term, trunc, info = pool.step(_act([1.0, 2.0]))
        assert term.all() and (obs[:, 0] == 5).all()  # the ending step shows the final obs
        np.testing.assert_array_equal(info["episode_return"], [5.0, 10.0])
        np.testing.assert_array_equal(info["episode_length"], [5, 5])
        obs, rew, term, trunc, info = pool.step(_act([7.0, 7.0]))  # ignored: this step resets
        assert (obs[:, 0] == 0).all() and (obs[:, 1] == 0).all()
        assert (rew == 0).all() and not term.any() and not trunc.any()
        assert (info["episode_length"] == 0).all()
        obs, rew, *_ = pool.step(_act([3.0, 3.0]))
        assert (obs[:, 0] == 1).all() and (rew == 3).all()


def test_autoreset_same_step():
    with envs.make("Counter-test", num_envs=2, autoreset="same_step") as pool:
        pool.reset()
        for _ in range(5):
            obs, rew, term, trunc, info = pool.step(_act([1.0, 2.0]))
        assert term.all() and (rew == [1.0, 2.0]).all()
        assert (obs[:, 0] == 0).all()  # already the new episode
        np.testing.assert_array_equal(info["final_obs"][:, 0], [5, 5])
        np.testing.assert_array_equal(info["final_obs"][:, 1], [5.0, 10.0])
        np.testing.assert_array_equal(info["episode_return"], [5.0, 10.0])
        obs, rew, term, _, info = pool.step(_act([3.0, 3.0]))
        assert (obs[:, 0] == 1).all() and not term.any()
        np.testing.assert_array_equal(info["episode_return"], [3.0, 3.0])


@pytest.mark.parametrize("num_workers", [1, 2])
def test_autoreset_disabled_raises_before_sending_and_reset_recovers(num_workers):
    with envs.make("Counter-test", num_envs=2, autoreset="disabled",
                   num_workers=num_workers) as pool:
        pool.reset()
        for _ in range(5):
            obs, rew, term, *_ = pool.step(_act([1.0, 1.0]))
        assert term.all()
        with pytest.raises(EpisodeEndedError, match="autoreset is disabled"):
            pool.step(_act([1.0, 1.0]))
        obs, info = pool.reset(env_id=[1])
        assert obs.shape == (1, 4) and obs[0, 0] == 0 and info["env_id"].tolist() == [1]
        with pytest.raises(EpisodeEndedError, match=r"env_id \[0\]"):
            pool.step(_act([1.0, 1.0]))
        pool.reset(env_id=[0])
        obs, _, term, *_ = pool.step(_act([1.0, 1.0]))
        np.testing.assert_array_equal(obs[:, 0], [1, 1])
        assert not term.any()
    assert issubclass(EpisodeEndedError, ValueError)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3,)), "shape"),
    (np.zeros((4, 1)), "shape"),
    (np.zeros(4, bool), "dtype"),
    (np.full(4, 11.0), "outside"),
    (np.array([0.0, np.nan, 0.0, 0.0]), "outside"),
])
def test_bad_actions_raise_before_sending_and_pool_stays_usable(bad, match):
    with envs.make("Counter-test", num_envs=4, num_workers=2) as pool:
        pool.reset()
        with pytest.raises(ValueError, match=match):
            pool.step(bad)
        obs, rew, *_ = pool.step(_act([1, 2, 3, 4]))
        np.testing.assert_array_equal(obs[:, 0], [1, 1, 1, 1])  # nothing was sent before


@pytest.mark.parametrize("env_id, match", [
    ([4], "out of range"), ([-1], "out of range"), ([1, 1], "repeats"),
    ([0.5], "ints"), ([], "ints"),
])
def test_bad_env_ids_raise(env_id, match):
    with envs.make("Counter-test", num_envs=4, env_batch_size=1, num_workers=1) as pool:
        pool.reset()
        with pytest.raises(ValueError, match=match):
            pool.send(_act(np.zeros(len(env_id))), env_id)
        pool.send(_act([1.0]), [0])
        with pytest.raises(ValueError, match="in flight"):
            pool.send(_act([1.0]), [0])
        assert pool.recv()[4]["env_id"].tolist() == [0]


def test_env_exception_surfaces_with_env_id_and_traceback_quickly():
    with envs.make("CounterFail-test", num_envs=4, num_workers=2) as pool:
        pool.reset()
        pool.step(_act(np.zeros(4)))
        pool.step(_act(np.zeros(4)))
        t0 = time.monotonic()
        with pytest.raises(EnvWorkerError) as err:
            pool.step(_act(np.zeros(4)))
        assert time.monotonic() - t0 < 5.0
        assert "env_id [" in str(err.value) and "CounterEnv was told to fail here" in str(err.value)
        assert "Traceback" in str(err.value)
        with pytest.raises(EnvWorkerError):  # the pool stays failed, it does not hang
            pool.step(_act(np.zeros(4)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failed_pool_dropped_unclosed_frees_its_workers_and_memory_at_once(num_workers):
    """Without the cyclic collector (as between its runs): a failure kept with its traceback
    held the pool's frames, so a pool dropped without close() kept its worker processes and
    its shared memory until a collection, which then could not free the block."""
    import gc

    before = shm_entries()
    gc.disable()
    try:
        pool = envs.make("CounterFail-test", num_envs=4, num_workers=num_workers)
        obs, _ = pool.reset()
        pids = set(obs[:, 3].astype(int).tolist()) - {os.getpid()}
        for _ in range(2):
            pool.step(_act(np.zeros(4)))
        for _ in range(2):  # the failure, then the failed pool's answer
            with pytest.raises(EnvWorkerError):
                pool.step(_act(np.zeros(4)))
        del pool
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert not shm_left(before)
    finally:
        gc.enable()


def test_a_traceback_larger_than_a_pipe_surfaces_and_the_pool_closes_cleanly():
    pool = envs.make("CounterFailLong-test", num_envs=4, num_workers=2)
    try:
        obs, _ = pool.reset()
        pids = set(obs[:, 3].astype(int).tolist())
        pool.step(_act(np.zeros(4)))
        caught = []

        def step():  # in a thread: were the pool to hang again, the test fails, not the suite
            try:
                pool.step(_act(np.zeros(4)))
            except EnvWorkerError as e:
                caught.append(e)

        waiter = threading.Thread(target=step, daemon=True)
        waiter.start()
        waiter.join(10)
        assert not waiter.is_alive(), "the pool hung on a traceback larger than a pipe"
        assert "told to fail here" in str(caught[0]) and len(str(caught[0])) > 200_000
    finally:
        pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_an_env_that_raises_in_this_process_fails_the_pool_as_a_worker_does():
    with envs.make("CounterFail-test", num_envs=4, num_workers=0) as pool:
        pool.reset()
        pool.step(_act(np.zeros(4)))
        pool.step(_act(np.zeros(4)))
        with pytest.raises(EnvWorkerError) as err:
            pool.step(_act(np.zeros(4)))
        msg = str(err.value)
        assert "an env raised in step (in this process)" in msg
        assert "CounterEnv was told to fail here" in msg and "The pool cannot continue" in msg
        for again in (lambda: pool.step(_act(np.zeros(4))), pool.reset):
            with pytest.raises(EnvWorkerError, match="told to fail here"):  # not "in flight"
                again()


def test_killed_worker_is_reported_within_5s():
    with envs.make("Counter-test", num_envs=4, num_workers=2) as pool:
        obs, _ = pool.reset()
        os.kill(int(obs[3, 3]), signal.SIGKILL)  # obs[:, 3] is the worker's pid
        t0 = time.monotonic()
        with pytest.raises(EnvWorkerError, match=r"env_id 2..3\) was killed by signal 9"):
            pool.step(_act(np.zeros(4)))
        assert time.monotonic() - t0 < 5.0


def test_close_leaves_no_process_and_no_shared_memory():
    before = shm_entries()
    pool = envs.make("Counter-test", num_envs=4, num_workers=2)
    obs, _ = pool.reset()
    pids = set(obs[:, 3].astype(int).tolist())
    assert len(pids) == 2 and os.getpid() not in pids
    pool.step(_act(np.ones(4)))
    pool.close()
    pool.close()  # idempotent
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not shm_left(before)
    with pytest.raises(RuntimeError, match="closed"):
        pool.step(_act(np.ones(4)))


def test_a_forked_child_cannot_step_the_parents_workers_and_its_close_spares_them():
    """A child forked from a process that holds a pool (a DataLoader worker, say) shares the
    workers' shared memory: a step there would step the parent's envs behind its back."""
    def first_step():
        pool = envs.make("CartPole-v1", 2, seed=0, engine="gymnasium", num_workers=2)
        pool.reset()
        return pool

    ref = first_step()
    expected = ref.step(np.zeros(2, np.int64))[0].copy()
    ref.close()
    pool = first_step()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what happened through the pipe, never return to pytest
        code = 1
        try:
            try:
                pool.step(np.ones(2, np.int64))
            except RuntimeError as e:
                os.write(write, str(e).encode())
                pool.close()
                code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    message = os.read(read, 4096).decode()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0, "the child stepped the pool, or close raised"
    assert "a forked child of it cannot step them" in message
    np.testing.assert_array_equal(pool.step(np.zeros(2, np.int64))[0], expected)
    pool.close()


def test_make_reports_every_invalid_argument_at_once():
    with pytest.raises(ValueError) as err:
        envs.make("NoSuchTask-v0", num_envs=0, env_batch_size=5, autoreset="sometimes")
    msg = str(err.value)
    for part in ("num_envs=0", "env_batch_size=5", "autoreset='sometimes'", "NoSuchTask-v0"):
        assert part in msg
    with pytest.raises(ValueError, match="num_envs=True must be an int >= 1"):
        envs.make("CartPole-v1", num_envs=True)


def test_registered_callable_and_list_tasks():
    assert "Counter-test" in envs.list_tasks()
    with pytest.raises(ValueError, match="exactly one"):
        envs.register("Nothing-test")


def test_an_observation_space_that_is_no_array_is_named():
    with pytest.raises(ValueError, match=r"Blackjack-v1: observation space Tuple\(.*\) is not "
                       r"an array space .* gymnasium.wrappers.FlattenObservation"):
        envs.make("Blackjack-v1", num_envs=2)
    with envs.make("FrozenLake-v1", num_envs=2) as pool:  # Discrete: one int per env
        assert pool.reset()[0].shape == (2,)


class _TupleActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Tuple([gym.spaces.Discrete(2)])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_an_action_space_a_pool_cannot_take_is_named_with_or_without_workers(num_workers):
    envs.register("TupleAction-test", _TupleActionEnv)
    with pytest.raises(ValueError, match=r"unsupported action space Tuple\(Discrete\(2\)\)"):
        envs.make("TupleAction-test", num_envs=2, num_workers=num_workers)


class _IntBoxEnv(gym.Env):
    """Actions in an integer Box; the observation is the last action."""

    observation_space = gym.spaces.Box(-5, 5, (2,), np.int64)
    action_space = gym.spaces.Box(-5, 5, (2,), np.int64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.int64), {}

    def step(self, action):
        return np.asarray(action, np.int64), 0.0, False, False, {}


def test_an_integer_box_takes_integer_actions_and_a_float_box_takes_both():
    envs.register("IntBox-test", _IntBoxEnv)
    with envs.make("IntBox-test", num_envs=2, num_workers=0) as pool:
        pool.reset()
        obs = pool.step(np.array([[1, -2], [5, -5]]))[0]
        np.testing.assert_array_equal(obs, [[1, -2], [5, -5]])
        with pytest.raises(ValueError, match="expected an integer dtype"):
            pool.step(np.zeros((2, 2), np.float32))
    with envs.make("Pendulum-v1", num_envs=2, seed=0) as a, \
            envs.make("Pendulum-v1", num_envs=2, seed=0) as b:
        a.reset(), b.reset()
        np.testing.assert_array_equal(a.step(np.array([[1], [-2]]))[0],
                                      b.step(np.array([[1.0], [-2.0]], np.float32))[0])


@pytest.mark.parametrize("task, engine", [("Pendulum-v1", "auto"), ("CartPole-v1", "auto"),
                                          ("Hopper-v5", "native"), ("Hopper-v5", "numpy")])
def test_max_episode_steps_sets_the_time_limit_as_in_gymnasium(task, engine):
    with envs.make(task, num_envs=2, engine=engine, max_episode_steps=7, seed=0) as pool:
        pool.reset()
        assert pool.spec.max_episode_steps == 7
        zeros = np.zeros((2, *pool.action_space.shape), pool.action_space.dtype)
        ends = [pool.step(zeros)[3].copy() for _ in range(7)]
        assert not np.any(ends[:6]) and ends[6].all()  # (the zero action keeps them alive)
    with pytest.raises(ValueError, match="max_episode_steps=0 must be an int >= 1"):
        envs.make(task, num_envs=2, engine=engine, max_episode_steps=0)
    with envs.make(task, num_envs=2, engine=engine, max_episode_steps=None) as pool:
        default = envs.make(task, num_envs=1, engine=engine)
        assert pool.spec.max_episode_steps == default.spec.max_episode_steps  # the task's own
        default.close()


def test_cartpoles_native_engine_takes_its_own_limit_or_none():
    for limit in (None, 500):
        with envs.make("CartPole-v1", num_envs=2, max_episode_steps=limit) as pool:
            assert type(pool).__name__ == "CartPoleNativePool"


def test_a_keyword_the_task_does_not_take_is_named_with_those_it_takes():
    for engine in ("native", "numpy"):
        with pytest.raises(ValueError, match=r"Hopper-v5 does not take the keyword\(s\) "
                           r"\['bogus'\]; it takes \[.*'healthy_reward'.*'max_episode_steps'\]"):
            envs.make("Hopper-v5", num_envs=2, engine=engine, bogus=1)


@pytest.mark.parametrize("task", ["CartPole-v1", "Pendulum-v1", "Hopper-v5", "Pong-v5",
                                  "Reacher-v5"])  # C++, NumPy, C++ MuJoCo, Atari, generic
def test_every_engine_refuses_to_step_an_env_never_reset_and_stays_usable(task):
    with envs.make(task, num_envs=2, num_workers=1) as pool:
        space = pool.action_space
        actions = np.stack([space.sample() for _ in range(2)])
        with pytest.raises(gym.error.ResetNeeded, match=r"env_id \[0, 1\] never reset"):
            pool.step(actions)
        pool.reset(env_id=[0])
        with pytest.raises(gym.error.ResetNeeded, match=r"env_id \[1\] never reset"):
            pool.send(actions[1:], [1])
        pool.reset()
        assert pool.step(actions)[0].shape[0] == 2


def test_info_episode_end_is_terminated_or_truncated_for_ordinary_tasks():
    with envs.make("Counter-test", num_envs=4, env_batch_size=2, num_workers=1) as pool:
        pool.reset()
        pool.send(_act(np.ones(4)), np.arange(4))
        for step in range(12):
            obs, rew, term, trunc, info = pool.recv()
            np.testing.assert_array_equal(info["episode_end"], term | trunc)
            pool.send(_act(np.ones(2)), info["env_id"])
        assert (info["episode_end"] == term).all()


def test_num_workers_0_is_serial_and_steps_like_the_worker_path():
    with envs.make("Counter-test", num_envs=3, num_workers=0, seed=4) as serial, \
            envs.make("Counter-test", num_envs=3, num_workers=2, seed=4) as workers:
        a, b = serial.reset()[0].copy(), workers.reset()[0]
        assert (a[:, 3] == os.getpid()).all() and not (b[:, 3] == os.getpid()).any()
        np.testing.assert_array_equal(a[:, :3], b[:, :3])
        for _ in range(7):
            a = serial.step(_act([1.0, 2.0, 3.0]))[0].copy()
            b = workers.step(_act([1.0, 2.0, 3.0]))[0]
        np.testing.assert_array_equal(a[:, :3], b[:, :3])


def test_a_factory_that_does_not_pickle_leaves_no_shared_memory():
    import threading

    from gmi_drl.envs.stepper import AutoresetMode
    from gmi_drl.envs.workers import ProcessEngine

    lock = threading.Lock()  # cloudpickle cannot pickle a lock
    before = shm_entries()
    space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(TypeError, match="lock"):
        ProcessEngine(lambda ids: lock, 4, 2, space, space, AutoresetMode.NEXT_STEP, None,
                      np.arange(4))
    assert not shm_left(before)


@pytest.mark.parametrize("engine", ["native", "numpy"])
def test_in_flight_rules_hold_on_every_send_path(engine):
    """A second send of all envs, the last recv's ids sent back after some of them were sent
    again, and a step of too few ids to fill a batch are each refused before anything is
    stepped; info["env_id"] cannot be written into."""
    with envs.make("CartPole-v1", 4, seed=0, engine=engine) as pool:
        _, info = pool.reset()
        with pytest.raises(ValueError):
            info["env_id"][0] = 9  # the pool's own ids
        pool.send(np.zeros(4, np.int64))
        with pytest.raises(ValueError, match="already has a step in flight"):
            pool.send(np.ones(4, np.int64))
        assert pool.recv()[4]["episode_length"].tolist() == [1, 1, 1, 1]
        with pytest.raises(RuntimeError, match="send\\(\\) actions for more envs first"):
            pool.recv()
    with envs.make("CartPole-v1", 4, env_batch_size=2, seed=0, engine=engine) as pool:
        _, info = pool.reset()
        pool.send(np.zeros(4, np.int64), info["env_id"])
        ids = pool.recv()[4]["env_id"]
        pool.send(np.zeros(1, np.int64), np.array([ids[0]]))
        with pytest.raises(ValueError, match="already has a step in flight"):
            pool.send(np.zeros(2, np.int64), ids)
    with envs.make("CartPole-v1", 4, engine=engine) as pool:
        pool.reset()
        with pytest.raises(ValueError, match="cannot return a batch of 4"):
            pool.step(np.zeros(2, np.int64), np.array([0, 1]))
        pool.reset()  # nothing was left in flight
        assert pool.step(np.zeros(4, np.int64))[4]["episode_length"].tolist() == [1, 1, 1, 1]
