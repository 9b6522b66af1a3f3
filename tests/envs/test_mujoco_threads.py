"""The C++ thread engine of the v5 MuJoCo tasks (`gmi_drl.envs.mujoco_threads`).

Its lockstep with Gymnasium is in ``test_mujoco_locomotion.py`` (`make` picks this engine for
its tasks where it is built); here: equality with the NumPy engine in every autoreset mode
and in async pools, float64 actions, the engine option, and clean shutdown.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gmi_drl.envs as envs
from gmi_drl.envs import mujoco_threads as mt
from gmi_drl.envs.engine import LocalEngine

REASON = mt.unavailable_reason()
needs_core = pytest.mark.skipif(REASON is not None, reason=f"thread engine: {REASON}")


def _run(pool, rounds: int, seed: int, dtype=np.float32) -> list[tuple]:
    """Random actions for ``rounds`` steps (EnvPool's send/recv loop in async pools); every
    returned value, copied. With autoreset ``disabled``, ended envs are reset by hand."""
    rng = np.random.default_rng(seed)
    shape = pool.action_space.shape
    out = [tuple(np.copy(x) for x in pool.reset())[:1]]
    ids = np.arange(pool.num_envs)
    for _ in range(rounds):
        space = pool.action_space
        acts = rng.uniform(space.low, space.high, (len(ids), *shape)).astype(dtype)
        obs, rew, term, trunc, info = pool.step(acts, ids)
        ids = info["env_id"].copy()
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy(), ids,
                    info["episode_return"].copy(), info["episode_length"].copy(),
                    info["final_obs"][term | trunc].copy() if "final_obs" in info else None))
        if pool.autoreset.value == "disabled" and (term | trunc).any():
            out.append(tuple(np.copy(x) for x in pool.reset(ids[term | trunc])[:1]))
    return out


def _assert_same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b)):
        for u, v in zip(x, y):
            if u is None or v is None:
                assert u is None and v is None
            else:
                np.testing.assert_array_equal(u, v, err_msg=f"result {t}")


@needs_core
@pytest.mark.parametrize("task_id", list(mt.TASKS))
@pytest.mark.parametrize("autoreset", ["next_step", "same_step", "disabled"])
def test_equals_numpy_engine(task_id, autoreset):
    ends = 0
    runs = []
    for engine in ("native", "numpy"):
        with envs.make(task_id, num_envs=4, num_workers=2, seed=5, autoreset=autoreset,
                       engine=engine) as pool:
            want = mt.MujocoThreadEngine if engine == "native" else LocalEngine
            assert type(pool._engine) is want
            runs.append(_run(pool, 300, seed=1))
    _assert_same(*runs)
    ends = sum(int((r[2] | r[3]).sum()) for r in runs[0] if len(r) > 1)
    if task_id in ("Hopper-v5", "Walker2d-v5", "Humanoid-v5"):
        assert ends > 0  # the comparison covered episode ends and resets


@needs_core
def test_async_pool_and_float64_actions_equal_numpy_engine():
    """Completion order may differ between engines; per env, the trajectories must not."""
    runs = []
    for engine in ("native", "numpy"):
        with envs.make("Hopper-v5", num_envs=8, env_batch_size=3, num_workers=2, seed=2,
                       engine=engine, autoreset="same_step") as pool:
            per_env = {i: [] for i in range(8)}
            rng = np.random.default_rng(0)
            acts = rng.uniform(-1, 1, (8, 400, 3))  # float64: ctrl cost in float64
            count = np.zeros(8, int)
            pool.reset()
            pool.send(acts[:, 0], np.arange(8))
            count[:] = 1
            for _ in range(600):
                obs, rew, term, trunc, info = pool.recv()
                ids = info["env_id"].copy()
                for j, i in enumerate(ids):
                    per_env[i].append((obs[j].copy(), rew[j], term[j], trunc[j]))
                pool.send(acts[ids, count[ids]], ids)
                count[ids] += 1
            runs.append(per_env)
    for i in range(8):
        k = min(len(runs[0][i]), len(runs[1][i]))
        assert k >= 100
        for (o1, *r1), (o2, *r2) in zip(runs[0][i][:k], runs[1][i][:k]):
            np.testing.assert_array_equal(o1, o2)
            assert r1 == r2


def test_engine_option():
    with pytest.raises(ValueError, match="engine='gpu' must be one of"):
        envs.make("Hopper-v5", num_envs=2, engine="gpu")
    with envs.make("Hopper-v5", num_envs=2, engine="numpy") as pool:
        assert type(pool._engine) is LocalEngine
    with envs.make("Hopper-v5", num_envs=2) as pool:  # auto
        assert (type(pool._engine) is mt.MujocoThreadEngine) == (REASON is None)


@needs_core
def test_close_joins_the_worker_threads():
    def threads() -> int:  # the OS's count: C++ threads are not in `threading`
        return len(os.listdir("/proc/self/task"))

    before = threads()
    pool = envs.make("Walker2d-v5", num_envs=6, env_batch_size=2, num_workers=3)
    assert threads() == before + 2  # the caller steps envs while it waits: one of the 3
    pool.reset()
    pool.send(np.zeros((6, 6), np.float32), np.arange(6))
    pool.recv()
    pool.close()  # 4 envs still in flight: close must still return
    assert threads() == before
