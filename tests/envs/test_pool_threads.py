"""One Python thread sends while another receives (EnvPool's threading contract): under load,
every env's trajectory equals its single-threaded one, and the pool's bookkeeping holds."""

import queue
import sys
import threading
import time

import numpy as np
import pytest

from gmi_drl import envs
from gmi_drl.envs import mujoco_threads

NUM_ENVS, BATCH = 8, 4


def _actions(space, steps: int) -> np.ndarray:
    """``(NUM_ENVS, steps, *action_shape)``: env ``i``'s ``k``-th action, whoever sends it."""
    rng = np.random.default_rng(3)
    if not space.shape:  # Discrete
        return rng.integers(0, space.n, (NUM_ENVS, steps))
    return rng.uniform(space.low, space.high,
                       (NUM_ENVS, steps, *space.shape)).astype(space.dtype)


def _preempted_in_its_count(pool) -> None:
    """Make every read of ``pool``'s in-flight count give the GIL away (a sleep), so that a
    thread is preempted inside each read-modify-write of it: without the pool's lock, a send's
    ``+=`` and a recv's ``-=`` then lose updates (checked: with the lock a no-op, the count
    and the refusals go wrong)."""
    base = type(pool)

    class Preempted(base):
        @property
        def _num_in_flight(self):
            n = self.__dict__["_count"]
            time.sleep(1e-6)  # (releases the GIL)
            return n

        @_num_in_flight.setter
        def _num_in_flight(self, n):
            self.__dict__["_count"] = n

    count = pool.__dict__.pop("_num_in_flight")
    pool.__class__ = Preempted
    pool._num_in_flight = count


def _threaded(task: str, rounds: int, preempted: bool = False, **kwargs):
    """Run ``rounds`` recvs in one thread and the sends in another; each env's observations,
    rewards and episode lengths in its step order, and the actions used (``preempted``: see
    `_preempted_in_its_count`)."""
    pool = envs.make(task, NUM_ENVS, env_batch_size=BATCH, num_workers=2, seed=7, **kwargs)
    if preempted:
        _preempted_in_its_count(pool)
    acts = _actions(pool.action_space, rounds * BATCH + 1)
    sent = np.zeros(NUM_ENVS, int)
    seen = {i: [] for i in range(NUM_ENVS)}
    handoff: queue.Queue = queue.Queue()
    batches = threading.Semaphore(0)  # batches of BATCH envs sent and not received
    errors = []

    def send(ids: np.ndarray) -> None:
        pool.send(acts[ids, sent[ids]], ids)
        sent[ids] += 1

    def sender() -> None:
        try:
            while (ids := handoff.get()) is not None:
                send(ids)
                batches.release()
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            batches.release()

    def receiver() -> None:
        try:
            for _ in range(rounds):
                batches.acquire()
                if errors:
                    return
                obs, reward, _, _, info = pool.recv()
                ids = info["env_id"].copy()  # the buffer is reused at the next recv
                for k, i in enumerate(ids):
                    seen[i].append((obs[k].copy(), reward[k], info["episode_length"][k]))
                handoff.put(ids)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
        finally:
            handoff.put(None)

    with pool:
        pool.reset()
        for half in (np.arange(BATCH), np.arange(BATCH, NUM_ENVS)):
            send(half)
            batches.release()
        threads = [threading.Thread(target=sender), threading.Thread(target=receiver)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert pool._num_in_flight == int((sent - [len(v) for v in seen.values()]).sum())
    return seen, acts


def _reference(task: str, seen, acts, **kwargs):
    """Each env stepped alone in one thread, full batches, with the same per-env actions."""
    steps = max(len(v) for v in seen.values())
    with envs.make(task, NUM_ENVS, num_workers=2, seed=7, **kwargs) as pool:
        pool.reset()
        out = []
        for k in range(steps):
            obs, reward, _, _, info = pool.step(acts[:, k])
            out.append((obs.copy(), reward.copy(), info["episode_length"].copy()))
    return out


@pytest.mark.parametrize("task, rounds, kwargs", [
    ("Pendulum-cpp-v1", 3000, {}),
    ("Pendulum-v1", 1500, {"engine": "numpy"}),
    pytest.param("Hopper-v5", 600, {"engine": "native"},
                 marks=pytest.mark.skipif(mujoco_threads.unavailable_reason() is not None,
                                          reason="the MuJoCo core is not built")),
    ("CartPole-v1", 300, {"engine": "gymnasium"}),  # processes: the lock spans recv's wait
])
def test_one_thread_sends_while_another_receives(task, rounds, kwargs):
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the GIL changes hands between almost any two bytecodes
    try:
        seen, acts = _threaded(task, rounds, **kwargs)
    finally:
        sys.setswitchinterval(interval)
    assert sum(len(v) for v in seen.values()) == rounds * BATCH
    want = _reference(task, seen, acts, **kwargs)
    for i, steps in seen.items():
        for k, (obs, reward, length) in enumerate(steps):
            np.testing.assert_array_equal(obs, want[k][0][i], err_msg=f"env {i} step {k}")
            assert reward == want[k][1][i] and length == want[k][2][i], (i, k)


def test_the_bookkeeping_holds_with_a_thread_preempted_inside_it():
    """The send and the recv each preempted inside the in-flight count's read-modify-write
    (`_preempted_in_its_count`): the pool's lock keeps every update, so every env's trajectory
    is its single-threaded one and the count is exact at the end."""
    seen, acts = _threaded("Pendulum-cpp-v1", 400, preempted=True)
    assert sum(len(v) for v in seen.values()) == 400 * BATCH
    want = _reference("Pendulum-cpp-v1", seen, acts)
    for i, steps in seen.items():
        for k, (obs, reward, length) in enumerate(steps):
            np.testing.assert_array_equal(obs, want[k][0][i], err_msg=f"env {i} step {k}")
