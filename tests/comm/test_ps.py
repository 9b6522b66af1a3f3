"""The parameter server (iSwitch's PS baseline) over real loopback TCP: the mean in rank order,
refusals with their reason, a worker that dies, and GMIs training through it."""

import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from gmi_drl.comm.ps import ParameterServer, PSReducer
from gmi_drl.config import ConfigError, validate
from gmi_drl.train import train
from tests.algos.test_placements import small_cfg


@pytest.fixture
def server():
    ps = ParameterServer(("127.0.0.1", 0), 3, member_timeout_s=20)
    thread = threading.Thread(target=ps.serve_forever, daemon=True)
    thread.start()
    yield ps
    ps.close()


def _addr(ps):
    host, port = ps.address
    return f"{host}:{port}"


def _workers(addr, world, fn):
    """Run ``fn(reducer)`` on ``world`` workers (threads, one socket each); return the
    results by rank."""
    out, errors = [None] * world, []

    def run(rank):
        try:
            red = PSReducer(addr, rank, world, timeout_s=20)
            try:
                out[rank] = fn(red)
            finally:
                red.close()
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out, errors


def test_every_worker_receives_the_mean_in_rank_order_round_after_round(server):
    rng = np.random.default_rng(0)
    grads = [[rng.normal(size=s).astype(np.float32) for s in ((5, 3), (7,), (1000,))]
             for _ in range(3)]

    def rounds(red):
        got = []
        for step in range(4):  # the second tensor list changes size: rounds of new lengths
            ts = [torch.from_numpy(g * (step + 1)).clone() for g in grads[red.rank][:2 + step % 2]]
            red.allreduce_(ts)
            got.append([t.numpy().copy() for t in ts])
        return got

    out, errors = _workers(_addr(server), 3, rounds)
    assert not errors
    for step in range(4):
        for k in range(2 + step % 2):
            scaled = [grads[r][k] * (step + 1) for r in range(3)]
            want = (scaled[0] + scaled[1] + scaled[2]) / np.float32(3)
            for rank in range(3):
                np.testing.assert_array_equal(out[rank][step][k], want)
    assert server.rounds == 4


def test_a_bad_group_size_or_a_taken_rank_is_refused_with_the_reason(server):
    with pytest.raises(RuntimeError, match="group size 2, the server serves groups of 3"):
        PSReducer(_addr(server), 0, 2, timeout_s=5)
    first = PSReducer(_addr(server), 1, 3, timeout_s=5)
    try:
        with pytest.raises(RuntimeError, match="rank 1 is taken"):
            PSReducer(_addr(server), 1, 3, timeout_s=5)
    finally:
        first.close()
    with pytest.raises(ValueError, match="rank=3"):
        PSReducer(_addr(server), 3, 3)


def test_a_worker_that_dies_mid_run_fails_the_others_and_the_server_takes_a_new_group():
    code = """
import sys, torch
from gmi_drl.comm.ps import PSReducer
r = PSReducer(sys.argv[1], 1, 2, timeout_s=20)
r.allreduce_([torch.ones(10)])
print("reduced", flush=True)
import os; os._exit(1)
"""
    ps = ParameterServer(("127.0.0.1", 0), 2, member_timeout_s=20)
    threading.Thread(target=ps.serve_forever, daemon=True).start()
    try:
        child = subprocess.Popen([sys.executable, "-c", code, _addr(ps)], stdout=subprocess.PIPE,
                                 text=True)
        red = PSReducer(_addr(ps), 0, 2, timeout_s=20)
        t = torch.zeros(10)
        red.allreduce_([t])
        assert torch.equal(t, torch.full((10,), 0.5))
        assert child.stdout.readline() == "reduced\n" and child.wait(20) == 1
        with pytest.raises(RuntimeError, match="round 1, worker 0"):
            red.allreduce_([t])
        red.close()
        out, errors = _workers(_addr(ps), 2, lambda r: (r.allreduce_([x := torch.ones(3)]), x)[1])
        assert not errors and all(torch.equal(x, torch.ones(3)) for x in out)
    finally:
        ps.close()


def test_no_server_is_a_clear_error(caplog):
    with pytest.raises(RuntimeError, match=r"no parameter server at 127.0.0.1:9 within 0.5 s: "
                       r"Connection refused; start it first: python -m gmi_drl.comm.ps --bind "
                       r"127.0.0.1:9 --workers 2"):
        PSReducer("127.0.0.1:9", 0, 2, join_timeout_s=0.5)
    assert "parameter server at 127.0.0.1:9: Connection refused; retrying for up to 0.5 s" \
        in caplog.text  # said once, while it waits


@pytest.mark.distributed
def test_gmis_training_through_the_server_learn_exactly_as_through_shared_memory(tmp_path):
    """Two DQN GMIs, one through the parameter server (its own process, as users start it),
    one through shared memory: (a + b) / 2 in float32 either way, so the same weights."""
    proc = subprocess.Popen([sys.executable, "-m", "gmi_drl.comm.ps", "--bind", "127.0.0.1:0",
                             "--workers", "2"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:")
        runs = {}
        for reduction in ("ps", "mpr"):
            cfg = small_cfg(tmp_path, "dqn", 2, reduction)
            cfg.gmi.reduction = reduction
            cfg.gmi.ps_addr = line.split()[-1] if reduction == "ps" else None
            runs[reduction] = train(cfg)
    finally:
        proc.terminate()
        tail = proc.communicate(timeout=20)[0]
    assert runs["ps"].weight_digests == runs["mpr"].weight_digests
    assert len(set(runs["ps"].weight_digests)) == 1
    assert "parameter server at" in (runs["ps"].run_dir / "summary.md").read_text()
    assert "groups 1 rounds" in tail


def test_the_ps_reduction_needs_an_address(tmp_path):
    cfg = small_cfg(tmp_path, "dqn", 2, "bad")
    cfg.gmi.reduction = "ps"
    with pytest.raises(ConfigError, match="gmi.ps_addr=None must be HOST:PORT"):
        validate(cfg)
