"""The async_training template (GMI-DRL §4.2, §5.1): serving and trainer GMIs joined by
experience channels, in one process (serial mode) and in GMI processes."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gmi_drl.config import ConfigError, preset, validate
from gmi_drl.train import train
from tests.procs import (assert_group_gone, gmi_processes, shm_entries, shm_left, signal_group,
                         start_cli, wait_until_written)


def _appo(tmp_path, name, algo="appo", **kw):
    cfg = preset("classic", "CartPole-v1", algo)
    cfg.log.tensorboard, cfg.run_dir = False, str(tmp_path / name)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def test_serial_appo_learns_cartpole_and_writes_its_run(tmp_path):
    """One serving and one trainer role in this process: CartPole's return rises from ~22
    (random play) past 100 within 20k steps (seed 1 reached 176.8)."""
    result = train(_appo(tmp_path, "serial", total_timesteps=20_000, placement="serial"))
    assert np.mean(result.episode_returns[-20:]) > 100
    run = result.run_dir
    summary = (run / "summary.md").read_text()
    assert "trainer GMIs [0] (the trainer role), serving GMIs [1]" in summary
    assert "experience channels: multi" in summary
    names = {row.split(",")[2] for row in (run / "metrics.csv").read_text().splitlines()[1:]}
    assert {"async/policy_lag_mean", "async/stale_dropped", "perf/env_sps", "channels/dropped",
            "losses/importance_ratio", "env/episodic_return"} <= names
    lags = (run / "policy_lag.csv").read_text().splitlines()
    assert lags[0] == "policy_lag,fragments" and len(lags) > 1


@pytest.mark.parametrize("algo,splits", [("appo", 1), ("a3c", 1), ("appo", 2)])
def test_the_first_update_is_the_same_in_one_process_and_in_gmi_processes(tmp_path, algo,
                                                                          splits):
    """Where determinism allows: the first batch is collected with the initial weights in
    both modes, so the weights after the first update are bit-identical. (After it they part
    ways: a serving GMI process keeps collecting with the old weights while the trainer
    updates; in one process the next fragment waits for the update.)"""
    digests, seen = [], {"serial": [], "local": []}
    for placement in ("serial", "local"):
        cfg = _appo(tmp_path, placement, algo, placement=placement, compile=False)
        cfg.total_timesteps = cfg.batch_size
        cfg.async_.env_splits = splits
        digests.append(train(cfg, on_progress=seen[placement].append).weight_digests[0])
    assert digests[0] == digests[1]
    # the trainer's progress reaches on_progress from its own process too
    assert [p.global_step for p in seen["local"]] == [p.global_step for p in seen["serial"]]
    assert seen["local"][-1].global_step == cfg.batch_size


def test_two_trainers_hold_identical_weights_and_two_channels_modes_learn(tmp_path):
    for channel in ("multi", "uni"):
        cfg = _appo(tmp_path, channel, total_timesteps=16_384, compile=False)
        cfg.gmi.serving_gmis, cfg.gmi.trainer_gmis = 2, 2
        cfg.async_.channel = channel
        result = train(cfg)
        assert len(result.weight_digests) == 2
        assert result.weight_digests[0] == result.weight_digests[1]
        summary = (result.run_dir / "summary.md").read_text()
        assert "weights identical on all 2 trainer GMIs after every 10 updates: yes" in summary
        assert "gradient reduction among trainer GMIs: `mpr`" in summary
        assert f"experience channels: {channel}" in summary
        assert "(those in trainer GMI 0's batches, of 2 trainer GMIs)" in summary


def test_stale_fragments_are_dropped_and_counted(tmp_path):
    cfg = _appo(tmp_path, "lag", total_timesteps=20_480, compile=False)
    cfg.gmi.serving_gmis, cfg.async_.max_policy_lag = 2, 0
    result = train(cfg)
    lags = (result.run_dir / "policy_lag.csv").read_text().splitlines()[1:]
    assert [line.split(",")[0] for line in lags] == ["0"]  # only fresh fragments trained on
    rows = [row.split(",") for row in (result.run_dir / "metrics.csv").read_text().splitlines()]
    dropped = [float(r[3]) for r in rows if r[2] == "async/stale_dropped"]
    assert dropped[-1] > 0
    trained = sum(int(line.split(",")[1]) for line in lags)
    summary = (result.run_dir / "summary.md").read_text()
    assert (f"fragments more than 0 versions old were dropped: {int(dropped[-1]):,} of the "
            f"{int(dropped[-1]) + trained:,} the trainer GMIs took in this invocation") in summary


def test_a_killed_serving_gmi_stops_the_run_naming_it_and_leaves_nothing(tmp_path):
    shm_before = shm_entries()
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gmi_drl.cli", "train", "appo", "--gmi.serving-gmis", "2",
         "--total-timesteps", "100000000", "--checkpoint.every", "5", "--no-compile",
         "--log.no-tensorboard", "--run-dir", str(run)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_written(proc, run, "checkpoints/iteration-*.pt", "no checkpoint written")
        gmis = gmi_processes(proc.pid)
        assert len(gmis) == 3, gmis
        os.kill(gmis[-1], signal.SIGKILL)  # started last: serving GMI 2
        killed = time.monotonic()
        _, err = proc.communicate(timeout=30)
        stopped_s = time.monotonic() - killed
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "gmi-drl train: GMI 2 was killed by signal 9 without a result" in err
    # promptly: not at the channels' 120-s timeout (5.6 s once under the full suite's load)
    assert stopped_s < 15.0
    assert not gmi_processes(proc.pid)
    assert not shm_left(shm_before)  # channels, weights, groups unlinked


def test_templates_and_their_algorithms_must_match(tmp_path):
    ppo = preset("classic", "CartPole-v1")
    ppo.gmi.serving_gmis, ppo.async_.channel = 3, "uni"
    with pytest.raises(ConfigError, match="async.channel, gmi.serving_gmis set, but ppo runs in "
                                          "the sync_training template"):
        validate(ppo)
    cfg = _appo(tmp_path, "bad2", placement="serial")
    cfg.gmi.serving_gmis, cfg.gmi.num_gmis = 2, 2
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "gmi.num_gmis=2 is the holistic GMIs of sync_training" in str(err.value)
    assert "placement='serial' runs one serving and one trainer GMI" in str(err.value)
    cfg = _appo(tmp_path, "bad3")
    cfg.async_.env_splits = 3  # 8 envs
    with pytest.raises(ConfigError, match="async.env_splits=3 must be >= 1 and divide "
                                          "env.num_envs=8"):
        validate(cfg)
    cfg = _appo(tmp_path, "bad4")
    cfg.async_.backpressure, cfg.async_.channel_slots = "drop_oldest", 1
    cfg.async_.channel, cfg.async_.fragments_per_transfer = "uni", 2
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "give async.channel_slots >= 2" in str(err.value)
    assert "the compressor joins fragments of the multi-channel only" in str(err.value)


def test_ctrl_c_stops_an_async_run_and_leaves_nothing(tmp_path):
    shm_before = shm_entries()
    run = tmp_path / "run"
    proc = start_cli(["train", "appo", "--gmi.serving-gmis", "2", "--total-timesteps",
                      "100000000", "--no-compile", "--log.no-tensorboard", "--checkpoint.every",
                      "0", "--run-dir", str(run)], tmp_path)
    err = signal_group(proc, lambda: wait_until_written(  # metrics.csv: the GMIs run
        proc, run, "metrics.csv", "the run did not start"), signal.SIGINT)
    assert proc.returncode == 130, err
    assert "gmi-drl train: interrupted; the run was stopped" in err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert "no checkpoint was written: run the same command to start over" in err
    assert_group_gone(proc.pid, shm_before, tmp_path)


def test_an_async_run_resumes_and_its_checkpoint_evaluates(tmp_path):
    from gmi_drl.evaluate import evaluate

    cfg = _appo(tmp_path, "first", total_timesteps=4 * 512, compile=False)
    cfg.checkpoint.every = 2
    first = train(cfg)
    assert first.global_step == 2048

    def fragments():  # policy_lag.csv: fragments trained on, over every lag
        rows = (first.run_dir / "policy_lag.csv").read_text().splitlines()[1:]
        return sum(int(r.split(",")[1]) for r in rows)

    before = fragments()
    more = _appo(tmp_path, "unused", total_timesteps=8 * 512, compile=False)
    more.run_dir, more.resume = None, str(first.run_dir)
    resumed = train(more)
    assert resumed.run_dir == first.run_dir and resumed.global_step == 4096
    assert fragments() == 2 * before  # the resumed half's fragments added, none lost
    assert len(resumed.episode_returns) > len(first.episode_returns)  # continued, not restarted
    collected = [float(r.split(",")[3]) for r in (first.run_dir / "metrics.csv").read_text()
                 .splitlines() if ",async/env_steps," in r]
    assert collected == sorted(collected) and collected[-1] >= 4096, collected  # a total
    report = evaluate(first.run_dir, episodes=3)
    assert len(report.returns) == 3 and (report.returns > 0).all()


@pytest.mark.slow
def test_a_killed_serving_gmi_is_tolerated_when_asked(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gmi_drl.cli", "train", "appo", "--gmi.serving-gmis", "2",
         "--async.tolerate-serving-failures", "--total-timesteps", "61440", "--no-compile",
         "--log.no-tensorboard", "--run-dir", str(run)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_written(proc, run, "metrics.csv", "the run did not start", poll_s=0.1)
        gmis = gmi_processes(proc.pid)
        assert len(gmis) == 3, gmis
        os.kill(gmis[-1], signal.SIGKILL)  # serving GMI 2
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "done: 61,440 steps" in out
    assert "GMI 2 was killed by signal 9 without a result; the run goes on without it" in err
    summary = (run / "summary.md").read_text()
    assert "serving GMI 2: failed during the run; the run went on without it" in summary
    assert "serving GMI 1: " in summary


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_split_serving_fragments_replay_on_the_envs(splits):
    """Double-buffered sampling (``async.env_splits``): with the envs in ``splits`` pools
    stepped in the background while the role acts on another split, every column of every
    fragment is still its env's own trajectory: replaying the fragments' actions on one pool of
    the same seeds gives their observations, rewards, flags and last observations."""
    import torch

    from gmi_drl import envs
    from gmi_drl.algos.appo import APPO
    from gmi_drl.comm.channels import Batcher, ChannelPlan, Dispenser, Fabric
    from gmi_drl.comm.weights import WeightStore
    from gmi_drl.config import ModelConfig
    from gmi_drl.rollout.acting import make_acting
    from gmi_drl.rollout.arrays import HostArrays
    from gmi_drl.rollout.trajectory import fragment_fields
    from gmi_drl.runner.roles import ServingRole

    T, B, F = 16, 4, 3
    per = B // splits
    pools = [envs.make("Hopper-v5", per, seed=s * per, autoreset="same_step", num_workers=2
                       if per > 1 else 1) for s in range(splits)]
    spec = pools[0].spec
    fields = fragment_fields(spec.observation_space, spec.action_space, T, B)
    fabric = Fabric.create(ChannelPlan(fields, T, B, 1, 1, "multi", 1, F, "block"))
    store = WeightStore.create(8)
    try:
        torch.manual_seed(0)
        model = APPO.acting_model(spec, ModelConfig())
        acting = make_acting(model, torch.Generator().manual_seed(1), HostArrays())
        role = ServingRole(pools, model, acting, None, None, Dispenser(fabric, 0), store)
        batcher = Batcher(fabric, 0, fragments_per_batch=1)
        fragments = []
        for _ in range(F):
            role.collect()
            assert batcher.next(timeout_s=5)
            fragments.append({k: v.numpy().copy() for k, v in batcher.batch.items()})
        assert role.env_steps == F * T * B
    finally:
        for pool in pools:
            pool.close()
        fabric.close()
        store.close()

    space = spec.action_space
    ends = 0
    with envs.make("Hopper-v5", B, seed=0, autoreset="same_step") as ref:
        obs, _ = ref.reset()
        for frag in fragments:
            for t in range(T):
                np.testing.assert_array_equal(frag["obs"][t], obs.astype(np.float32))
                action = np.clip(frag["actions"][t], space.low, space.high)
                obs, reward, term, trunc, _ = ref.step(action.astype(space.dtype))
                np.testing.assert_array_equal(frag["rewards"][t], reward.astype(np.float32))
                np.testing.assert_array_equal(frag["terminated"][t], term)
                np.testing.assert_array_equal(frag["truncated"][t], trunc)
                ends += int(term.sum())
            np.testing.assert_array_equal(frag["last_obs"], obs.astype(np.float32))
            assert (frag["policy_version"] == -1).all()  # acted before any weights were published
    assert ends > 0  # the episodes ended and were reset inside the fragments


def test_trainers_wait_for_each_other_longer_than_for_their_batches():
    """A trainer whose batch is late is stopped by its own batcher after ``async.timeout_s``,
    with the reason; the other trainers, waiting for it inside the gradient reduction, must
    not break the group first (the MPR barrier used to give up after a fixed 60 s)."""
    from types import SimpleNamespace

    from gmi_drl.comm.shm import ShmGroup
    from gmi_drl.gmi.context import ReductionGroup
    from gmi_drl.gmi.devices import discover
    from gmi_drl.gmi.layout import plan
    from gmi_drl.runner.async_loop import _trainer_reducer, trainer_reduce_timeout_s

    cfg = preset("classic", "CartPole-v1", "appo")
    cfg.gmi.trainer_gmis, cfg.async_.timeout_s = 2, 300.0
    layout = plan(2, discover(), reduction="mpr")
    group, owner = ShmGroup.create(2, 16)
    try:
        spec = SimpleNamespace(run=SimpleNamespace(config=cfg), trainer_layout=layout,
                               trainer_group=ReductionGroup((group,), ""))
        reducer = _trainer_reducer(spec, 0)
        try:
            assert reducer.timeout_s == trainer_reduce_timeout_s(300.0) > 300.0
        finally:
            reducer.close()
    finally:
        ShmGroup.destroy(owner)


@pytest.mark.parametrize("algo", ["appo", "a3c"])
def test_gmi_processes_in_lockstep_learn_as_the_serial_placement(tmp_path, algo):
    """The async serial twin: with ``async.lockstep`` (fragment f acted with the weights of
    update f // fragments_per_batch), a trainer and a serving GMI process hold, after K
    updates, the weights of the serial placement's threads bit for bit; at every logged
    update (the digest chains them) and in the final checkpoint's modules."""
    import torch

    digests, modules = [], []
    for placement in ("serial", "local"):
        cfg = _appo(tmp_path, placement, algo, placement=placement, compile=False)
        cfg.total_timesteps, cfg.log.log_every = 6 * cfg.batch_size, 2
        cfg.async_.lockstep = placement == "local"  # (serial: always)
        result = train(cfg)
        digests.append(result.weight_digests[0])
        last = sorted((result.run_dir / "checkpoints").glob("iteration-*.pt"))[-1]
        modules.append(torch.load(last, weights_only=False)["algo"]["modules"])
    assert digests[0] == digests[1]
    for name, state in modules[0].items():
        for key, value in state.items():
            assert torch.equal(value, modules[1][name][key]), (name, key)
