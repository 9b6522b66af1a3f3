"""Every algorithm on every placement: GMIs as threads and as processes, each gradient reducer
(mpr, mrr, har, ring, the aggregation switch, synchronous and stale-sync), all GMIs ending with
identical weights after every update and every env step counted."""

import numpy as np
import pytest

from gmi_drl.config import preset
from gmi_drl.train import train

TASKS = {"a2c": "CartPole-v1", "dqn": "CartPole-v1", "ddpg": "Pendulum-v1",
         "td3": "Pendulum-v1", "sac": "Pendulum-v1", "ppo": "CartPole-v1"}


def small_cfg(tmp_path, algo, num_gmis, name):
    """A few updates of ``algo`` on ``num_gmis`` GMIs of 2 envs each (6 iterations)."""
    cfg = preset("classic", TASKS[algo], algo=algo)
    cfg.env.num_envs, cfg.compile = 2, False
    if TASKS[algo] == "Pendulum-v1":  # (its own episodes are 200 steps: episodes end here too)
        cfg.env.max_episode_steps = 20
    cfg.model.actor_hidden = cfg.model.critic_hidden = "16"
    cfg.log.log_every, cfg.log.tensorboard = 1, False
    cfg.gmi.num_gmis = num_gmis
    a = cfg.algo
    if algo in ("dqn", "ddpg", "td3", "sac"):  # (a minibatch the warm replay holds)
        a.learning_starts, a.minibatch_size, a.train_frequency, a.gradient_steps = 8, 8, 4, 3
    if algo == "ppo":
        a.num_steps = 16
    cfg.total_timesteps = 6 * cfg.batch_size
    cfg.run_dir = str(tmp_path / name)
    return cfg


def _check(result, cfg):
    assert len(result.weight_digests) == cfg.gmi.num_gmis
    assert len(set(result.weight_digests)) == 1
    assert result.global_step == 6 * cfg.batch_size


@pytest.mark.distributed
@pytest.mark.parametrize("algo", ["a2c", "ddpg", "td3", "sac"])
def test_serial_gmis_hold_identical_weights(tmp_path, algo):
    cfg = small_cfg(tmp_path, algo, 2, "serial")
    cfg.placement = "serial"
    _check(train(cfg), cfg)


@pytest.mark.distributed
@pytest.mark.parametrize("algo", ["a2c", "dqn", "td3", "sac"])
def test_serial_gmis_learn_exactly_as_gmi_processes(tmp_path, algo):
    """GMIs as threads and as processes, reducing through shared memory: the same final
    weights and the same episodes (with two GMIs the mean is (a + b) / 2 in float32 whichever
    reducer forms it). Pendulum's episodes are cut at 20 steps (`small_cfg`), so some end."""
    runs = {}
    for placement in ("serial", "local"):
        cfg = small_cfg(tmp_path, algo, 2, placement)
        cfg.placement = placement
        cfg.total_timesteps = 6 * cfg.batch_size
        runs[placement] = train(cfg)
        assert len(set(runs[placement].weight_digests)) == 1
    serial, local = runs["serial"], runs["local"]
    assert serial.weight_digests == local.weight_digests
    assert serial.global_step == local.global_step == cfg.total_timesteps
    assert len(serial.episode_returns) > 0
    np.testing.assert_array_equal(serial.episode_returns, local.episode_returns)


@pytest.mark.distributed
@pytest.mark.parametrize("algo, num_gmis, num_devices, reduction", [
    ("a2c", 3, 2, "har"), ("sac", 2, 2, "mrr"), ("sac", 2, None, "ring"),
    ("dqn", 2, None, "mpr"), ("ddpg", 2, None, "ring"), ("sac", 3, 2, "har")])
def test_gmi_processes_hold_identical_weights(tmp_path, algo, num_gmis, num_devices, reduction):
    """SAC, whose three optimised modules (actor, critics, entropy coefficient) each reduce
    through their own stream, on mrr, ring and har (mpr: the serial-against-processes test)."""
    cfg = small_cfg(tmp_path, algo, num_gmis, reduction)
    cfg.gmi.num_devices, cfg.gmi.reduction = num_devices, reduction
    result = train(cfg)
    _check(result, cfg)
    assert f"gradient reduction: `{reduction}`" in (result.run_dir / "summary.md").read_text()


@pytest.mark.distributed
@pytest.mark.parametrize("algo, staleness", [("td3", 1), ("ddpg", 2), ("a2c", 1), ("dqn", 2),
                                             ("sac", 0), ("sac", 2)])
def test_the_aggregation_switch_reduces_every_algorithm(tmp_path, algo, staleness):
    from tests.comm.switch.harness import Switch

    switch = Switch("--mtu", "1500")
    try:
        cfg = small_cfg(tmp_path, algo, 2, "switch")
        cfg.gmi.reduction, cfg.gmi.switch_addr = "switch", switch.addr
        cfg.gmi.staleness = staleness
        result = train(cfg)
        stats = switch.stats()
    finally:
        assert switch.stop() == 0, switch.stderr
    _check(result, cfg)
    assert stats["segments_completed"] > 0


@pytest.mark.distributed
@pytest.mark.parametrize("algo, threshold", [("td3", None), ("sac", 1)])
def test_replay_actor_critics_drain_only_where_the_weights_are_digested(tmp_path, monkeypatch,
                                                                        algo, threshold):
    """Stale-sync (S = 2) and threshold (H = 1) steps stay in flight across iterations: the
    targets follow their networks on the LWU thread, the steps drain only at the logged
    iterations (3 and 6 of 6, both GMIs), and both GMIs end each with identical weights."""
    from gmi_drl.algos.ddpg import ReplayActorCritic
    from tests.comm.switch.harness import Switch

    drains = []
    drain = ReplayActorCritic.drain

    def counted(self):
        drains.append(self.iteration)
        return drain(self)

    monkeypatch.setattr(ReplayActorCritic, "drain", counted)
    switch = Switch("--mtu", "1500")
    try:
        cfg = small_cfg(tmp_path, algo, 2, "switch")
        cfg.placement, cfg.log.log_every = "serial", 3
        cfg.gmi.reduction, cfg.gmi.switch_addr = "switch", switch.addr
        cfg.gmi.staleness, cfg.gmi.threshold = 2, threshold
        result = train(cfg)
        stats = switch.stats()
    finally:
        assert switch.stop() == 0, switch.stderr
    _check(result, cfg)
    assert sorted(drains) == [3, 3, 6, 6]
    # the switch ran the mode asked for: threshold aggregates with H, or stale-sync rounds (the
    # mode itself is the job's: gone from the stats once the run left)
    assert (stats["aggregates_completed"] > 0) == (threshold is not None), stats
