"""Thread affinity of the native cores (EnvPool's ``thread_affinity_offset``): worker threads
pinned where ``make(..., thread_affinity=)`` asks, and clear refusals before anything runs."""

import os

import numpy as np
import pytest

from gmi_drl import envs
from gmi_drl.envs import mujoco_threads

pytestmark = pytest.mark.skipif(mujoco_threads.unavailable_reason() is not None,
                                reason=str(mujoco_threads.unavailable_reason()))


def _threads() -> dict[int, str]:
    """``{tid: Cpus_allowed_list}`` of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            status = open(f"/proc/self/task/{tid}/status").read()
        except FileNotFoundError:
            continue
        out[int(tid)] = next(line.split(":")[1].strip() for line in status.splitlines()
                             if line.startswith("Cpus_allowed_list"))
    return out


@pytest.mark.parametrize("affinity, expected", [([1], {"1"}), (0, {"0"}), (1, {"1"})])
def test_worker_threads_run_on_the_cores_asked(affinity, expected):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    import threading

    before = _threads()
    me = threading.get_native_id()
    with envs.make("Hopper-v5", 4, num_workers=2, thread_affinity=affinity,
                   engine="native") as pool:
        new = {tid: cpus for tid, cpus in _threads().items() if tid not in before}
        assert set(new.values()) == expected, new  # one worker: the caller is the other thread
        pool.reset()
        for _ in range(20):
            pool.step(np.zeros((4, 3)))
        assert _threads()[me] == before[me]  # the caller's thread (it runs envs in recv) as it was


def test_affinity_refusals_name_the_problem():
    with pytest.raises(ValueError, match=r"names core\(s\) \[4096\] this process cannot run on"):
        envs.make("Hopper-v5", 2, thread_affinity=[0, 4096])
    with pytest.raises(ValueError, match="must be an int .* or a non-empty list of cores"):
        envs.make("Hopper-v5", 2, thread_affinity=[])
    with pytest.raises(ValueError, match="has no worker threads to pin"):
        envs.make("Hopper-v5", 2, thread_affinity=[0], engine="numpy")
