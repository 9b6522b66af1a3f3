"""Multi-GMI synchronous PPO (GMI-DRL §5.1 TCG_EX): every GMI ends with bit-identical weights,
in every placement."""

import numpy as np
import pytest

from gmi_drl.config import ConfigError, preset, validate
from gmi_drl.train import train


def _cfg(tmp_path, num_gmis, num_devices=None, name="run"):
    cfg = preset("classic", "CartPole-v1")
    cfg.env.num_envs, cfg.algo.num_steps = 4, 32
    cfg.gmi.num_gmis, cfg.gmi.num_devices = num_gmis, num_devices
    cfg.total_timesteps = 4 * cfg.batch_size
    cfg.log.tensorboard, cfg.compile = False, False
    cfg.run_dir = str(tmp_path / name)
    return cfg


@pytest.mark.distributed
@pytest.mark.parametrize("num_gmis, num_devices, strategy", [(2, None, "mpr"), (3, 2, "har")])
def test_gmis_hold_identical_weights_and_count_every_step(tmp_path, caplog, num_gmis,
                                                         num_devices, strategy):
    """... and GMI 0's progress, from its own process, reaches the caller's ``on_progress``
    (one that raises is not called again, and the run goes on)."""
    cfg = _cfg(tmp_path, num_gmis, num_devices)
    seen = []

    def on_progress(p):
        seen.append(p.global_step)
        if num_gmis == 3:
            raise ValueError("a bug in the caller's callback")

    result = train(cfg, on_progress=on_progress)
    per_update = 4 * 32 * num_gmis
    assert seen == ([per_update * k for k in range(1, 5)] if num_gmis == 2 else [per_update])
    assert ("on_progress raised; it is not called again" in caplog.text) is (num_gmis == 3)
    assert len(result.weight_digests) == num_gmis
    assert len(set(result.weight_digests)) == 1
    assert result.global_step == 4 * 4 * 32 * num_gmis
    summary = (result.run_dir / "summary.md").read_text()
    assert f"gradient reduction: `{strategy}`" in summary and "identical on all" in summary
    assert f"(GMI 0's envs, of {num_gmis} GMIs)" in summary  # the curve is GMI 0's alone
    assert (result.run_dir / "checkpoints" / "iteration-0000004.pt").exists()
    assert (result.run_dir / "gmi-1" / "timeline.json").exists()
    assert not (result.run_dir / "gmi-1" / "metrics.csv").exists()  # only rank 0 writes metrics


@pytest.mark.distributed
def test_gmi_processes_may_start_env_worker_processes_of_their_own(tmp_path):
    """A task on the gymnasium engine steps its envs in worker processes, children of the GMI
    process (a daemonic GMI could not start them)."""
    cfg = _cfg(tmp_path, 2)
    cfg.env.task_id, cfg.env.num_workers = "Acrobot-v1", 2
    cfg.env.engine = "gymnasium"
    result = train(cfg)
    assert result.global_step == 4 * 4 * 32 * 2 and len(set(result.weight_digests)) == 1


def test_target_kl_is_refused_with_several_gmis(tmp_path):
    cfg = _cfg(tmp_path, 2)
    cfg.algo.target_kl = 0.01
    with pytest.raises(ConfigError, match="target_kl"):
        validate(cfg)


def test_switch_credentials_and_addresses_are_checked(tmp_path):
    cfg = _cfg(tmp_path, 2)
    cfg.gmi.switch_token = "s3cret"  # reduction auto
    with pytest.raises(ConfigError, match="gmi.switch_job / gmi.switch_token set, but"):
        validate(cfg)
    cfg.gmi.reduction, cfg.gmi.switch_addr = "switch", "127.0.0.1:99999"
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        validate(cfg)


@pytest.mark.distributed
def test_gmis_reduce_through_the_aggregation_switch(tmp_path):
    from tests.comm.switch.harness import Switch

    switch = Switch("--mtu", "1500", "--token", "s3cret", "--job-id", "lab-run")
    try:
        cfg = _cfg(tmp_path, 2)
        cfg.gmi.reduction, cfg.gmi.switch_addr = "switch", switch.addr
        cfg.gmi.switch_token, cfg.gmi.switch_job = "s3cret", "lab-run"  # what it serves only
        result = train(cfg)
        stats = switch.stats()
    finally:
        assert switch.stop() == 0, switch.stderr
    assert len(result.weight_digests) == 2 and len(set(result.weight_digests)) == 1
    assert stats["segments_completed"] > 0  # the gradients really went through the switch
    assert "aggregation switch at" in (result.run_dir / "summary.md").read_text()


@pytest.mark.distributed
@pytest.mark.slow
def test_a_run_stopped_by_ctrl_c_leaves_the_switch_and_resumes_on_it_at_once(tmp_path):
    """Stopped GMIs leave the switch's job, so the resume command the run prints works right
    away, not only after the switch's member timeout (10 s) drops the old members."""
    import signal
    import subprocess
    import sys
    import time

    from tests.comm.switch.harness import Switch
    from tests.procs import signal_group, start_cli, wait_until_written

    switch = Switch("--member-timeout", "30")
    run = tmp_path / "run"
    flags = ["--env.task-id", "CartPole-v1", "--env.num-envs", "4", "--algo.num-steps", "32",
             "--gmi.num-gmis", "2", "--gmi.reduction", "switch", "--gmi.switch-addr",
             switch.addr, "--no-compile", "--log.no-tensorboard"]
    try:
        proc = start_cli(["train", "ppo", *flags, "--total-timesteps", "100000000",
                          "--checkpoint.every", "1", "--run-dir", str(run)], tmp_path)
        signal_group(proc, lambda: wait_until_written(proc, run, "checkpoints/*.pt",
                                                      "the run made no checkpoint"),
                     signal.SIGINT)
        assert proc.returncode == 130
        assert switch.stats()["members"] == 0  # both GMIs left on their way out
        newest = max(int(p.stem.split("-")[1]) for p in run.glob("checkpoints/*.pt"))
        t0 = time.monotonic()  # two iterations more, of 2 GMIs x 4 envs x 32 steps
        again = subprocess.run(
            [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--resume", str(run),
             "--total-timesteps", str((newest + 2) * 256)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        assert switch.stop() == 0, switch.stderr
    assert again.returncode == 0, again.stderr
    assert time.monotonic() - t0 < 60


@pytest.mark.distributed
@pytest.mark.slow
def test_async_training_through_the_switch_learns_cartpole(tmp_path):
    """iSwitch §4.1 with S = 2 on a loopback switch: RL-Zoo CartPole settings, 2 GMIs, 40,960
    steps; the last 20 episodes average >= 50 (5 runs alone: 113-214, one under the full
    suite's load: 70.4, where more steps reach S; S = 0: 247; a random policy ~22), the
    staleness stays within S and reaches it, and the weights stay identical."""
    import csv

    from tests.comm.switch.harness import Switch

    switch = Switch("--mtu", "1500")
    try:
        cfg = preset("cartpole-zoo")
        cfg.gmi.num_gmis, cfg.total_timesteps = 2, 40_960
        cfg.gmi.reduction, cfg.gmi.switch_addr, cfg.gmi.staleness = "switch", switch.addr, 2
        cfg.log.tensorboard, cfg.run_dir = False, str(tmp_path / "run")
        result = train(cfg)
    finally:
        assert switch.stop() == 0, switch.stderr
    assert len(set(result.weight_digests)) == 1
    assert result.episode_returns[-20:].mean() >= 50, result.episode_returns[-20:]
    rows = list(csv.DictReader(open(result.run_dir / "metrics.csv")))
    worst = [float(r["value"]) for r in rows if r["name"] == "comm/staleness_max"]
    assert len(worst) == 80 and max(worst) == 2
    assert "staleness bound S = 2" in (result.run_dir / "summary.md").read_text()


def test_staleness_is_validated(tmp_path):
    cfg = _cfg(tmp_path, 2)
    cfg.gmi.staleness = 2
    with pytest.raises(ConfigError, match="gmi.staleness=2 needs gmi.reduction switch"):
        validate(cfg)
    cfg.gmi.reduction, cfg.gmi.switch_addr, cfg.gmi.staleness = "switch", "127.0.0.1:9", -1
    with pytest.raises(ConfigError, match="gmi.staleness=-1 must be >= 0"):
        validate(cfg)
    cfg.gmi.staleness, cfg.gmi.num_gmis = 2, 1
    with pytest.raises(ConfigError, match="needs gmi.num_gmis >= 2"):
        validate(cfg)


def test_threshold_is_validated(tmp_path):
    """Async iSwitch's H and S: out of range, or H < N where training is synchronous, is a
    ConfigError before anything starts, saying how to fix it."""
    cfg = _cfg(tmp_path, 3)
    cfg.gmi.threshold = 2
    with pytest.raises(ConfigError, match="gmi.threshold=2 needs gmi.reduction switch, not "
                       "'auto'.*drop --gmi.threshold"):
        validate(cfg)
    cfg.gmi.reduction, cfg.gmi.switch_addr = "switch", "127.0.0.1:9"
    with pytest.raises(ConfigError, match="gmi.threshold=2 < 3 GMIs with gmi.staleness=0 .*"
                       "give --gmi.staleness 1 or more"):
        validate(cfg)
    cfg.gmi.staleness = 2
    validate(cfg)
    for h, why in ((4, r"must be in \[1, 3\].*--gmi.threshold 3 or fewer"),
                   (0, "gmi.threshold=0 must be >= 1")):
        cfg.gmi.threshold = h
        with pytest.raises(ConfigError, match=why):
            validate(cfg)
    cfg.gmi.threshold, cfg.gmi.staleness = 3, 0  # H = N, S = 0: synchronous, allowed
    validate(cfg)
    cfg.gmi.threshold, cfg.gmi.staleness = 2, 200
    with pytest.raises(ConfigError, match="gmi.staleness=200 must be < 128"):
        validate(cfg)
    cfg.gmi.num_gmis, cfg.gmi.threshold, cfg.gmi.staleness = 300, 256, 2
    with pytest.raises(ConfigError, match=r"gmi.threshold=256 must be in \[1, 255\] .*a "
                       "packet's count holds at most 255"):
        validate(cfg)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("tree", [False, True], ids=["one-switch", "tree"])
def test_async_iswitch_trains_through_the_cli(tmp_path, tree):
    """``gmi-drl train ppo --gmi.reduction switch --gmi.staleness 2 --gmi.threshold 2`` with 3
    GMIs on a loopback switch (or on two ToRs under a root, ``--gmi.switch-addr`` naming each
    GMI's ToR): it trains, the (root) switch ran threshold mode, and every GMI ends each
    iteration with the same weights."""
    import subprocess
    import sys

    from tests.comm.switch.harness import Switch

    switches = [Switch("--mtu", "1500")]
    if tree:
        switches += [Switch("--mtu", "1500", "--parent", switches[0].addr, "--member-id", str(k),
                            "--switch-id", str(k + 1)) for k in range(2)]
    addrs = ",".join(s.addr for s in switches[1:] for _ in range(1 + (s is switches[1]))) \
        if tree else switches[0].addr
    try:
        run = tmp_path / "run"
        out = subprocess.run(
            [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--env.task-id", "CartPole-v1",
             "--env.num-envs", "4", "--algo.num-steps", "32", "--total-timesteps", "384",
             "--gmi.num-gmis", "3", "--gmi.reduction", "switch", "--gmi.switch-addr",
             addrs, "--gmi.staleness", "2", "--gmi.threshold", "2",
             "--log.no-tensorboard", "--no-compile", "--run-dir", str(run)],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        stats = switches[0].stats()
    finally:
        for s in switches:
            assert s.stop() == 0, s.stderr
    assert out.returncode == 0, out.stderr[-3000:]
    assert stats["aggregates_completed"] > 0 and stats["segments_completed"] > 0
    assert "weights identical on all 3 GMIs after every update: yes" in \
        (run / "summary.md").read_text()


def test_reducer_addresses_and_namespaces_are_validated(tmp_path):
    cfg = _cfg(tmp_path, 3)
    cfg.gmi.reduction, cfg.gmi.switch_addr = "switch", "10.0.0.1:9,10.0.0.2:9"
    cfg.gmi.netns = "a,b"
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert "one HOST:PORT per GMI joined by ',' (3)" in str(err.value)
    assert "must name one network namespace per GMI (3)" in str(err.value)
    cfg.gmi.switch_addr, cfg.gmi.netns = "10.0.0.1:9", "no-such-ns-1,no-such-ns-2,no-such-ns-3"
    assert cfg.gmi.switch_addrs == ("10.0.0.1:9",) * 3
    with pytest.raises(ConfigError, match=r"no network namespace \['no-such-ns-1'"):
        validate(cfg)
    cfg.gmi.netns, cfg.gmi.reduction, cfg.gmi.num_gmis = None, "ring", 1
    with pytest.raises(ConfigError, match="gmi.reduction='ring' reduces between GMIs"):
        validate(cfg)


def test_switch_reducer_needs_an_address(tmp_path):
    cfg = _cfg(tmp_path, 2)
    cfg.gmi.reduction = "switch"
    with pytest.raises(ConfigError, match="switch_addr"):
        validate(cfg)


@pytest.mark.distributed
def test_serial_gmis_are_the_twin_of_gmi_processes(tmp_path):
    """Two GMIs as threads of this process and two GMI processes, both reducing through shared
    memory (MPR): the same weights after every one of 4 updates, and the same returns."""
    runs = {}
    for placement in ("serial", "local"):
        cfg = _cfg(tmp_path, 2, name=placement)
        cfg.placement = placement
        runs[placement] = train(cfg)
    serial, local = runs["serial"], runs["local"]
    assert len(set(serial.weight_digests)) == 1
    assert serial.weight_digests == local.weight_digests
    np.testing.assert_array_equal(serial.episode_returns, local.episode_returns)
    summary = (serial.run_dir / "summary.md").read_text()
    assert "placement: serial: 2 GMIs as threads of this process" in summary
    assert "gradient reduction: `mpr`" in summary
    assert (serial.run_dir / "gmi-1" / "timeline.json").exists()


def test_forced_reductions_are_checked_against_the_layout(tmp_path):
    cfg = _cfg(tmp_path, 3, num_devices=2)
    cfg.gmi.reduction = "mrr"
    with pytest.raises(ConfigError, match="mrr needs the same number of GMIs on every device"):
        train(cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(),
                    reason="needs a CUDA device (CPU build of torch or no driver here)")
def test_gmi_threads_of_one_process_capture_their_steps_in_turn_on_cuda(tmp_path, caplog):
    """Serial placement: two GMI threads reach their first captured step together; captures
    take turns, none fails, and both GMIs end with the same weights."""
    cfg = _cfg(tmp_path, 2)
    cfg.placement, cfg.device, cfg.compile = "serial", "cuda", True
    result = train(cfg)
    assert len(result.weight_digests) == 2 and len(set(result.weight_digests)) == 1
    assert "CUDA graph capture of the gradient step failed" not in caplog.text
