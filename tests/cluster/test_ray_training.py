"""Multi-GMI training (PPO, and every other algorithm) through the Ray launcher on a real
two-node local cluster."""

import csv
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gmi_drl.config import preset
from gmi_drl.train import train
from tests.algos.test_placements import small_cfg
from tests.cluster.conftest import NODE_CPUS, assert_nothing_left
from tests.procs import shm_entries, wait_until_written

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _cfg(tmp_path, name, iterations, placement="ray", address=None):
    cfg = preset("classic", "CartPole-v1")
    cfg.env.num_envs, cfg.algo.num_steps = 4, 32
    cfg.gmi.num_gmis = 2
    cfg.total_timesteps = iterations * cfg.batch_size  # 256 env steps per update
    cfg.log.tensorboard, cfg.compile = False, False
    cfg.run_dir = str(tmp_path / name)
    cfg.placement = placement
    if placement == "ray":
        cfg.ray.address, cfg.ray.num_cpus_per_gmi = address, NODE_CPUS  # one GMI per node
    return cfg


def test_cli_starts_a_local_ray_instance_when_no_address_is_given(tmp_path):
    """Runs first, before the module's cluster starts: the CLI's own Ray instance."""
    pytest.importorskip("ray")
    run = tmp_path / "cli"
    out = subprocess.run(
        [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--env.task-id", "CartPole-v1",
         "--env.num-envs", "4", "--algo.num-steps", "32", "--gmi.num-gmis", "2",
         "--total-timesteps", "512", "--log.no-tensorboard", "--no-compile", "--placement", "ray",
         "--run-dir", str(run)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 512 steps" in out.stdout
    summary = (run / "summary.md").read_text()
    assert "placement: Ray, 1 node(s)" in summary and "gradient reduction: `mpr`" in summary


def test_sigterm_stops_a_ray_run_as_ctrl_c_does(ray_cluster, tmp_path):
    """ray.init installs a SIGTERM handler of its own in the driver; the launcher keeps the
    CLI's, so timeout(1) or systemd stop a Ray run as they stop a local one. The run directory
    is given relative to the driver's working directory, which the cluster's workers do not
    share: the GMIs write into the driver's, and the resume hint names it."""
    run = tmp_path / "term"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--env.task-id", "CartPole-v1",
         "--env.num-envs", "4", "--algo.num-steps", "32", "--gmi.num-gmis", "2",
         "--total-timesteps", "100000000", "--checkpoint.every", "1", "--log.no-tensorboard",
         "--no-compile", "--placement", "ray", "--ray.address", ray_cluster.address,
         "--ray.num-cpus-per-gmi", str(NODE_CPUS), "--run-dir", "term"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_written(proc, run, "checkpoints/iteration-*.pt", "no checkpoint written")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "gmi-drl train: interrupted; the run was stopped" in err
    assert f"continue with: gmi-drl train ppo --resume {run}" in err
    assert_nothing_left(ray_cluster)


def test_ppo_across_two_nodes_learns_exactly_as_the_local_launcher(ray_cluster, tmp_path,
                                                                   monkeypatch):
    """Same seed, same steps: the Ray run (one GMI per node, HAR over shared memory and a gloo
    ring of node leaders) and the local run (two emulated devices, one GMI each) produce
    bit-identical weights after every update, hence the same episodes and returns. With two
    GMIs every strategy forms the mean as (a + b) / 2 in float32, and addition of two numbers
    is commutative, so exact equality is the right test. The Ray run's driver never builds
    the task (its nodes may have dependencies the driver lacks): HAR's shared memory is sized
    on GMI 0's node."""
    def not_here(*args, **kwargs):
        raise AssertionError("the Ray driver built the task")

    with monkeypatch.context() as patched:
        patched.setattr("gmi_drl.train.build_on_cpu", not_here)
        patched.setattr("gmi_drl.runner.preflight.build_on_cpu", not_here)
        ray_run = train(_cfg(tmp_path, "ray", 8, address=ray_cluster.address))
    local_cfg = _cfg(tmp_path, "local", 8, placement="local")
    local_cfg.gmi.num_devices = 2
    local = train(local_cfg)

    assert len(ray_run.weight_digests) == 2 and len(set(ray_run.weight_digests)) == 1
    assert ray_run.weight_digests == local.weight_digests
    assert ray_run.global_step == local.global_step == 8 * 256
    np.testing.assert_array_equal(ray_run.episode_steps, local.episode_steps)
    np.testing.assert_array_equal(ray_run.episode_returns, local.episode_returns)
    summary = (ray_run.run_dir / "summary.md").read_text()
    assert "placement: Ray, 2 node(s)" in summary and "gradient reduction: `har`" in summary
    assert "identical on all 2 GMIs after every update: yes" in summary
    assert_nothing_left(ray_cluster)


@pytest.mark.parametrize("algo", ["dqn", "a2c", "td3", "sac"])
def test_every_algorithm_across_two_nodes_learns_exactly_as_the_local_launcher(
        ray_cluster, tmp_path, algo):
    """As PPO above: one GMI per node (HAR) against two emulated devices; the same weights and
    episodes, TD3's two gradient steps (actor and critics) and SAC's three (with alpha)
    included."""
    runs = {}
    for placement in ("ray", "local"):
        cfg = small_cfg(tmp_path, algo, 2, placement)
        cfg.total_timesteps = 12 * cfg.batch_size  # (Pendulum's episodes cut at 20 steps)
        cfg.placement = placement
        if placement == "ray":
            cfg.ray.address, cfg.ray.num_cpus_per_gmi = ray_cluster.address, NODE_CPUS
        else:
            cfg.gmi.num_devices = 2
        runs[placement] = train(cfg)
    ray_run, local = runs["ray"], runs["local"]
    assert len(set(ray_run.weight_digests)) == 1
    assert ray_run.weight_digests == local.weight_digests
    assert ray_run.global_step == local.global_step == cfg.total_timesteps
    assert len(ray_run.episode_returns) > 0
    np.testing.assert_array_equal(ray_run.episode_returns, local.episode_returns)
    assert "gradient reduction: `har`" in (ray_run.run_dir / "summary.md").read_text()
    assert_nothing_left(ray_cluster)


def test_async_ps_across_two_nodes(ray_cluster, tmp_path):
    """iSwitch's Async PS baseline (`--gmi.reduction ps --gmi.staleness 3`) on Ray, one GMI per
    node: SAC's three optimised modules each a stream of the server, every GMI's updates
    applied within S = 3 (none staler), the summary says so."""
    from tests.comm.test_ps import _addr, _async_server

    ps = _async_server(2)
    try:
        cfg = small_cfg(tmp_path, "sac", 2, "ray-async-ps")
        cfg.placement, cfg.gmi.reduction, cfg.gmi.staleness = "ray", "ps", 3
        cfg.gmi.ps_addr = _addr(ps)
        cfg.ray.address, cfg.ray.num_cpus_per_gmi = ray_cluster.address, NODE_CPUS
        result = train(cfg)
    finally:
        ps.close()
    assert result.global_step == 6 * cfg.batch_size
    assert len(ps.streams) == 3
    assert all(max(s.staleness_counts) <= 3 for s in ps.streams.values())
    assert ps.applied == sum(s.version for s in ps.streams.values()) > 0
    summary = (result.run_dir / "summary.md").read_text()
    assert "placement: Ray, 2 node(s)" in summary
    assert "staleness bound S = 3 (iSwitch's Async PS)" in summary
    assert_nothing_left(ray_cluster)


def test_a_killed_gmi_is_restarted_from_the_checkpoint(ray_cluster, tmp_path):
    cfg = _cfg(tmp_path, "restart", 16, address=ray_cluster.address)
    cfg.checkpoint.every = 2
    cfg.ray.max_restarts = 1
    result = _train_killing(cfg, 1)
    assert result.global_step == 16 * 256
    assert len(result.weight_digests) == 2 and len(set(result.weight_digests)) == 1
    # episodes restored from the checkpoint carry loop time 0: the second attempt resumed
    assert (result.episode_wall_s == 0).any() and result.episode_steps[-1] <= 16 * 256
    summary = (result.run_dir / "summary.md").read_text()
    assert "restarts from the last checkpoint after a GMI failed: 1" in summary
    rows = [(r["global_step"], r["name"]) for r in csv.DictReader(open(result.run_dir /
                                                                        "metrics.csv"))]
    assert len(rows) == len(set(rows))  # the redone updates replaced the failed attempt's rows
    assert_nothing_left(ray_cluster)


def test_weights_gone_nan_are_not_restarted(ray_cluster, tmp_path):
    """A restart would resume the same weights with the same settings and diverge again."""
    from gmi_drl.runner.run import RunStopped

    cfg = _cfg(tmp_path, "nan", 8, address=ray_cluster.address)
    cfg.algo.learning_rate, cfg.ray.max_restarts = 1e30, 2
    with pytest.raises(RunStopped) as err:
        train(cfg)
    assert "raised TrainingDiverged: training diverged by env step" in err.value.reason
    assert "restart" not in err.value.reason  # (after N restart(s))
    assert "resuming with the same settings would repeat it" in err.value.next_step
    assert_nothing_left(ray_cluster)


@pytest.mark.parametrize("gmi", [0, 2])
def test_a_killed_async_gmi_restarts_the_run_from_the_trainers_checkpoint(ray_cluster, tmp_path,
                                                                         gmi):
    """APPO on Ray, one trainer and two serving GMIs: the trainer (0) or a serving GMI (2) is
    killed after the trainer's first checkpoint; with ray.max_restarts 1 every GMI starts
    again from the trainer's newest checkpoint and the run ends. A killed trainer resumes
    mid-run; the trainer outlives a killed serving GMI for the launcher's grace period and may
    checkpoint its last update, so the restart then has nothing left to train and only ends
    the serving GMIs. The killed GMI's channel blocks are unlinked too (its node's agent)."""
    shm_before = shm_entries()
    cfg = preset("classic", "CartPole-v1", "appo")
    cfg.gmi.serving_gmis, cfg.placement = 2, "ray"
    cfg.ray.address, cfg.ray.num_cpus_per_gmi, cfg.ray.max_restarts = ray_cluster.address, 1, 1
    cfg.total_timesteps, cfg.compile, cfg.log.tensorboard = 20_480, False, False
    cfg.checkpoint.every = 2
    cfg.run_dir = str(tmp_path / "async-restart")
    result = _train_killing(cfg, gmi)

    assert result.global_step == 20_480
    log = (result.run_dir / "train.log").read_text()
    resumed = int(log.split("restarting every GMI from ")[1].split("iteration-")[1][:7])
    assert 0 < resumed <= cfg.num_iterations
    if gmi == 0:
        assert resumed < cfg.num_iterations  # the trainer died mid-run
        assert (result.episode_wall_s == 0).any()  # episodes restored from the checkpoint
    summary = (result.run_dir / "summary.md").read_text()
    assert "restarts from the last checkpoint after a GMI failed: 1" in summary
    assert_nothing_left(ray_cluster, shm_before=shm_before)


def _train_killing(cfg, gmi_id: int):
    """`train(cfg)` while GMI ``gmi_id``'s actor is killed after the first checkpoint."""
    killed = []
    killer = threading.Thread(target=_kill_gmi_after_first_checkpoint,
                              args=(Path(cfg.run_dir), gmi_id, killed), daemon=True)
    killer.start()
    result = train(cfg)
    killer.join(timeout=5)
    assert killed, f"GMI {gmi_id} was not killed during the run"
    return result


def _kill_gmi_after_first_checkpoint(run_dir: Path, gmi_id: int, killed: list) -> None:
    """From the driver (connected by the launcher), kill GMI ``gmi_id``'s actor with
    `ray.kill` once the run's first checkpoint exists."""
    import ray

    deadline = time.monotonic() + 120
    while not list((run_dir / "checkpoints").glob("iteration-*.pt")):
        if time.monotonic() > deadline:
            return
        time.sleep(0.02)
    names = [n for n in ray.util.list_named_actors() if n.endswith(f"-gmi-{gmi_id}")]
    if names:
        ray.kill(ray.get_actor(names[0]))
        killed.append(names[0])


def test_async_appo_across_two_nodes_bridges_the_channels(ray_cluster, tmp_path):
    """One trainer GMI and two serving GMIs as Ray actors on two nodes: each GMI makes its own
    channels, the trainer's TCP bridge joins them; the run learns, the weights reach every
    serving GMI, and nothing is left."""
    cfg = preset("classic", "CartPole-v1", "appo")
    cfg.gmi.serving_gmis, cfg.placement = 2, "ray"
    cfg.ray.address, cfg.ray.num_cpus_per_gmi = ray_cluster.address, 1
    cfg.total_timesteps, cfg.compile, cfg.log.tensorboard = 30_720, False, False
    cfg.run_dir = str(tmp_path / "async")
    result = train(cfg)
    assert result.global_step == 30_720
    assert np.mean(result.episode_returns[-20:]) > 50  # random play: ~22
    summary = (result.run_dir / "summary.md").read_text()
    assert "one actor per GMI" in summary and "each trainer GMI's TCP bridge" in summary
    assert summary.count("node ") >= 2 or summary.count("- node") >= 2, summary
    for gmi in (1, 2):
        line = next(l for l in summary.splitlines() if l.startswith(f"- serving GMI {gmi}:"))
        # "50 weight versions" must not read as "0 weight versions": compare the numbers
        m = re.search(r": ([\d,]+) env steps in [\d,]+ fragments, (\d+) weight versions", line)
        assert m and int(m[1].replace(",", "")) > 0 and int(m[2]) > 0, line
    assert_nothing_left(ray_cluster)


def test_async_appo_with_two_trainers_across_two_nodes(ray_cluster, tmp_path, caplog):
    """Two trainer GMIs and two serving GMIs as Ray actors on two nodes: each trainer listens
    on its own bridge (found through the run's rendezvous store), each serving GMI spreads its
    transfers over both, the trainers reduce gradients through a gloo ring and end with
    identical weights, and the run learns."""
    cfg = preset("classic", "CartPole-v1", "appo")
    cfg.gmi.serving_gmis, cfg.gmi.trainer_gmis, cfg.placement = 2, 2, "ray"
    cfg.ray.address, cfg.ray.num_cpus_per_gmi = ray_cluster.address, 1
    # each update averages two trainers' batches: twice the steps of the one-trainer test
    cfg.total_timesteps, cfg.compile, cfg.log.tensorboard = 61_440, False, False
    cfg.run_dir = str(tmp_path / "async-2")
    with caplog.at_level(logging.INFO, logger="gmi_drl.cluster.ray_launcher"):
        result = train(cfg)
    placed = next(r.getMessage() for r in caplog.records if "Ray placed" in r.getMessage())
    assert "; reduction `ring`: gloo among the trainer GMIs" in placed, placed
    assert result.global_step == 61_440
    assert len(result.weight_digests) == 2 and len(set(result.weight_digests)) == 1
    assert np.mean(result.episode_returns[-20:]) > 50  # random play: ~22
    summary = (result.run_dir / "summary.md").read_text()
    assert "gradient reduction among trainer GMIs: `ring`: gloo" in summary, summary
    for gmi in (2, 3):
        line = next(l for l in summary.splitlines() if l.startswith(f"- serving GMI {gmi}:"))
        m = re.search(r"(\d+) weight versions picked up, transfers to trainer GMIs "
                      r"\[(\d+), (\d+)\]", line)
        assert m and all(int(x) > 0 for x in m.groups()), line
    assert_nothing_left(ray_cluster)
