"""Stale-sync training through the switch (iSwitch §4.1): the staleness bound holds, measured
from the weights themselves; every worker holds the same weights after every update; S = 0 is
the synchronous reducer, bit for bit; S > 0 hides aggregation latency."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
import torch

from gmi_drl.comm.reducer import IdentityReducer
from gmi_drl.comm.switch.pipeline import StaleSyncPipeline
from tests.comm.switch.harness import ctx

P = 3000  # float32 weights: 9 segments at MTU 1500
STEPS = 16


def _gradient(w: np.ndarray, rank: int, t: int) -> np.ndarray:
    """Depends on the weights (so staleness changes the run); entry 0 is -1 on every worker, so
    ``w[0]`` counts the updates applied to ``w`` (the version, read from the weights)."""
    g = np.sin(w) + np.random.default_rng(1000 * t + rank).standard_normal(w.size)
    g = g.astype(np.float32)
    g[0] = -1.0
    return g


def _train(addr: str, rank: int, n: int, staleness, q) -> None:
    """``staleness`` None: `allreduce_` then update; an int: the pipeline with that bound."""
    from gmi_drl.comm.switch import SwitchReducer

    torch.set_num_threads(1)
    try:
        red = SwitchReducer(addr, rank, n, rto_s=0.05)
        theta = np.zeros(P, np.float32)
        chain = hashlib.sha256()

        def apply(mean: np.ndarray) -> None:
            theta[:] -= mean
            chain.update(theta.tobytes())

        seen = []  # (t, version read from the weights the gradient was computed on)
        t0 = time.perf_counter()
        if staleness is None:
            for t in range(STEPS):
                g = torch.from_numpy(_gradient(theta, rank, t))
                seen.append((t, int(theta[0])))
                red.allreduce_([g])
                apply(g.numpy())
            counts = {}
        else:
            local = np.zeros(P, np.float32)
            pipe = StaleSyncPipeline(red, staleness, apply)
            copy = lambda: np.copyto(local, theta)  # noqa: E731
            for t in range(STEPS):
                pipe.fetch(copy)
                seen.append((t, int(local[0])))
                pipe.push(torch.from_numpy(_gradient(local, rank, t)))
            pipe.drain(copy)
            assert np.array_equal(local, theta)
            counts = dict(pipe.staleness_counts)
            pipe.close()
        wall = time.perf_counter() - t0
        red.close()
        q.put((rank, (seen, chain.hexdigest(), theta, counts, wall)))
    except Exception as e:  # reported to the test, which fails with it
        q.put((rank, repr(e)))


def _run(addr: str, n: int, staleness, target=_train) -> dict:
    """``target(addr, rank, n, staleness, q)`` in ``n`` processes; ``{rank: what it put}``."""
    c = ctx()
    q = c.Queue()
    procs = [c.Process(target=target, args=(addr, r, n, staleness, q)) for r in range(n)]
    for p in procs:
        p.start()
    try:
        got = dict(q.get(timeout=60) for _ in range(n))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
        q.close()
        q.join_thread()
    bad = {r: v for r, v in got.items() if isinstance(v, str)}
    assert not bad, f"workers failed: {bad}"
    return got


@pytest.mark.distributed
def test_staleness_bound_identical_weights_and_sync_equivalence(switches):
    sw = switches("--mtu", "1500", "--delay-ms", "20")
    n = 3
    sync = _run(sw.addr, n, None)
    runs = {s: _run(sw.addr, n, s) for s in (0, 2)}
    for s, got in runs.items():
        digests = {v[1] for v in got.values()}
        assert len(digests) == 1, f"S={s}: workers' weights differ after some update"
        for rank, (seen, _, theta, counts, _) in got.items():
            staleness = [t - v for t, v in seen]
            assert max(staleness) <= s, (s, rank, staleness)
            assert min(staleness) >= 0
            # with 20 ms per aggregation and no compute, LGC runs to the bound at once
            assert max(staleness) == s, (s, rank, staleness)
            assert counts == {k: staleness.count(k) for k in set(staleness)}
            assert theta[0] == STEPS  # every update applied
    ref = next(iter(sync.values()))[1]
    assert {v[1] for v in runs[0].values()} == {ref}, "S=0 differs from the synchronous reducer"
    assert {v[1] for v in runs[2].values()} != {ref}, "staleness should change the weights"
    # aggregation latency hidden: sync pays >= 16 x 20 ms; S=2 overlaps 3 rounds
    wall = {name: max(v[4] for v in got.values()) for name, got in
            (("sync", sync), ("S0", runs[0]), ("S2", runs[2]))}
    assert wall["sync"] >= STEPS * 0.02
    assert wall["S2"] < 0.6 * wall["sync"], wall


def test_pipeline_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="switch reducer"):
        StaleSyncPipeline(IdentityReducer(), 1, lambda mean: None)


@pytest.mark.distributed
def test_push_without_fetch_and_negative_bound(switches):
    from gmi_drl.comm.switch import SwitchReducer

    sw = switches()
    red = SwitchReducer(sw.addr, 0, 1, join_timeout_s=10)
    try:
        with pytest.raises(ValueError, match="staleness_bound=-1"):
            StaleSyncPipeline(red, -1, lambda mean: None)
        pipe = StaleSyncPipeline(red, 1, lambda mean: None)
        with pytest.raises(RuntimeError, match="push without fetch"):
            pipe.push(torch.zeros(4))
        pipe.close()
    finally:
        red.close()


def _ppo(addr: str, rank: int, n: int, staleness, q) -> None:
    """Two PPO updates on a fixed random rollout per worker, through the gradient step the
    runner makes; the weights' digest after each."""
    import functools

    import gymnasium as gym

    from gmi_drl.algos import AlgoContext, ModelConfig, PPOConfig, build_algorithm
    from gmi_drl.comm.switch import SwitchReducer
    from gmi_drl.envs.spec import EnvSpec
    from gmi_drl.optim.grad_step import make_grad_step

    torch.set_num_threads(1)
    try:
        red = SwitchReducer(addr, rank, n, rto_s=0.05)
        spec = EnvSpec("test", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), None)
        steps = functools.partial(make_grad_step, reducer=red, staleness_bound=staleness)
        ctx = AlgoContext(spec, 4, ModelConfig(), 10, 0, steps, torch.Generator())
        torch.manual_seed(0)  # identical initial weights on every worker
        learner = build_algorithm(PPOConfig(num_steps=16, num_minibatches=4, update_epochs=2),
                                  ctx)
        g, buf = torch.Generator().manual_seed(rank), learner.buf
        buf.obs.copy_(torch.randn(buf.obs.shape, generator=g))
        buf.actions.copy_(torch.randint(0, 2, buf.actions.shape, generator=g))
        buf.logprobs.copy_(-torch.rand(buf.logprobs.shape, generator=g))
        for x in (buf.values, buf.advantages, buf.returns):
            x.copy_(torch.randn(x.shape, generator=g))
        digests, stats = [], []
        for _ in range(2):
            stats.append(learner.update())
            digests.append(hashlib.sha256(learner.grad_step.params.data.numpy().tobytes())
                           .hexdigest())
        learner.close()
        red.close()
        q.put((rank, (digests, stats)))
    except Exception as e:
        q.put((rank, repr(e)))


@pytest.mark.distributed
def test_ppo_stale_sync_zero_is_sync_and_stale_sync_keeps_weights_identical(switches):
    # (results 5 ms late, so that with S = 3 some step computes on weights that miss an
    # aggregate however fast the host: without a delay a quick round trip could leave none)
    sw = switches("--mtu", "1500", "--delay-ms", "5")
    got = {}
    for s in (None, 0, 3):
        got[s] = _run(sw.addr, 2, s, _ppo)
        assert got[s][0][0] == got[s][1][0], f"S={s}: the two workers' weights differ"
    assert got[0][0][0] == got[None][0][0], "PPO with S=0 differs from the synchronous path"
    assert got[3][0][0] != got[None][0][0]
    assert "comm/staleness_max" not in got[None][0][1][0]
    assert got[0][0][1][0]["comm/staleness_max"] == 0
    assert 0 < got[3][0][1][1]["comm/staleness_max"] <= 3


@pytest.mark.distributed
def test_a_broken_group_reaches_the_trainer(switches):
    """The switch dies with a round in flight: the LWU thread's error surfaces in `drain`."""
    from gmi_drl.comm.switch import SwitchReducer

    sw = switches()
    red = SwitchReducer(sw.addr, 0, 1, join_timeout_s=10, timeout_s=1.0, rto_s=0.05)
    pipe = StaleSyncPipeline(red, 2, lambda mean: None)
    try:
        sw.kill()
        pipe.fetch(lambda: None)
        pipe.push(torch.ones(10))
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="switch pipeline of worker 0 failed") as err:
            pipe.drain(lambda: None)
        assert time.monotonic() - t0 < 10
        assert "the group is broken" in str(err.value.__cause__)
    finally:
        pipe.close()
        red.close()
