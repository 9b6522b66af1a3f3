"""Failures a user reads: an expected failure stops the run with one or two lines (what
happened, the next command), the traceback in RUN_DIR/train.log (and on the terminal with
--debug); the command it names goes on."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

import gymnasium as gym
import numpy as np
import pytest

from gmi_drl import envs
from gmi_drl.checkpoint import load_checkpoint
from gmi_drl.comm.switch.client import SwitchError, SwitchReducer
from gmi_drl.config import preset
from gmi_drl.gmi.launcher import GMIError
from gmi_drl.envs.workers import EnvWorkerError
from gmi_drl.runner.run import RunStopped
from gmi_drl.train import train
from tests.procs import gmi_processes, shm_entries, shm_left, wait_until_written


class FailingEnv(gym.Env):
    """A 3-d point that raises on its ``fail_at``-th step (counted over episodes)."""

    def __init__(self, fail_at: int) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fail_at, self.steps = fail_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("FailingEnv was told to fail here")
        return np.zeros(3, np.float32), 1.0, self.steps % 10 == 0, False, {}


envs.register("Failing-test", FailingEnv)


def _cfg(tmp_path, fail_at: int):
    cfg = preset("classic", "CartPole-v1")
    cfg.env.task_id, cfg.env.num_envs, cfg.env.num_workers = "Failing-test", 2, 2
    cfg.algo.num_steps, cfg.algo.num_minibatches, cfg.total_timesteps = 16, 2, 32 * 10
    cfg.checkpoint.every, cfg.compile, cfg.log.tensorboard = 1, False, False
    cfg.run_dir = str(tmp_path / "run")
    envs.register("Failing-test", FailingEnv, fail_at=fail_at)
    return cfg


def test_a_failing_env_worker_stops_the_run_with_one_line_and_the_traceback_in_train_log(
        tmp_path):
    with pytest.raises(RunStopped) as err:
        train(_cfg(tmp_path, fail_at=5))
    stopped = err.value
    assert isinstance(stopped.__cause__, EnvWorkerError)
    assert stopped.reason.startswith("EnvWorkerError: env_id [")
    assert "raised RuntimeError: FailingEnv was told to fail here" in stopped.reason
    assert stopped.reason.endswith("; the run was stopped") and "\n" not in stopped.reason
    assert stopped.next_step == ("no checkpoint was written: once the cause above is dealt "
                                 "with, run the same command again")
    log = stopped.log_path.read_text()
    assert stopped.log_path == tmp_path / "run" / "train.log"
    assert "Traceback" in log and "FailingEnv was told to fail here" in log


def test_a_run_stopped_after_a_checkpoint_names_the_resume_command(tmp_path):
    with pytest.raises(RunStopped) as err:  # each env fails in iteration 3 (16 steps each)
        train(_cfg(tmp_path, fail_at=40))
    assert err.value.next_step == f"continue with: gmi-drl train ppo --resume {tmp_path / 'run'}"


class NanRewardEnv(FailingEnv):
    """`FailingEnv` that gives a NaN reward from its ``fail_at``-th step on, instead of raising."""

    def step(self, action):
        self.steps += 1
        reward = float("nan") if self.steps >= self.fail_at else 1.0
        return np.zeros(3, np.float32), reward, self.steps % 10 == 0, False, {}


@pytest.mark.parametrize("log_every", [1, 4])
def test_weights_gone_nan_stop_the_run_and_no_checkpoint_holds_them(tmp_path, log_every):
    """Found at the metrics row (log_every 1) or, between rows, at the checkpoint (4)."""
    import torch

    from gmi_drl.errors import TrainingDiverged

    cfg = _cfg(tmp_path, fail_at=40)  # each env's 40th step: iteration 3 (16 steps each)
    envs.register("Failing-test", NanRewardEnv, fail_at=40)
    cfg.log.log_every = log_every
    with pytest.raises(RunStopped) as err:
        train(cfg)
    assert isinstance(err.value.__cause__, TrainingDiverged)
    assert err.value.reason.startswith("TrainingDiverged: training diverged by env step 96: "
                                       "weight actor_critic.")
    assert "resuming with the same settings would repeat it" in err.value.next_step
    saved = sorted((tmp_path / "run" / "checkpoints").glob("*.pt"))
    assert [p.name for p in saved] == ["iteration-0000001.pt", "iteration-0000002.pt"]
    for path in saved:
        for module in load_checkpoint(path)["algo"]["modules"].values():
            assert all(bool(torch.isfinite(t).all()) for t in module.values())


def test_running_out_of_memory_says_so_not_to_run_the_same_command_again(tmp_path):
    import torch

    from gmi_drl.runner.run import Run

    run = Run(tmp_path, preset("classic"))
    try:
        torch.empty(10**15)  # 4 PB, past the address space: refused, overcommit or not
    except RuntimeError as e:
        cpu = e
    for cause in (cpu, MemoryError(), GMIError("GMI 1 raised OutOfMemoryError: CUDA out of "
                                               "memory", "", "OutOfMemoryError: CUDA out of")):
        assert RunStopped(run, cause).next_step.startswith("it ran out of memory: running it "
                                                           "again needs smaller sizes")
    assert RunStopped(run, RuntimeError("other")).next_step.startswith("no checkpoint")


def test_a_nan_loss_or_weight_is_named_and_a_nan_explained_variance_is_not():
    import torch

    from gmi_drl.errors import TrainingDiverged, check_finite

    fine = {"actor": {"w": torch.ones(2), "steps": torch.tensor(3)}}
    check_finite(fine, 10, {"losses/value_loss": 0.5, "losses/explained_variance": float("nan")})
    with pytest.raises(TrainingDiverged, match=r"by env step 10: losses td_loss=inf\."):
        check_finite(fine, 10, {"losses/td_loss": float("inf")})
    fine["critic"] = {"b": torch.tensor([0.0, float("nan")])}
    with pytest.raises(TrainingDiverged, match="weight critic.b is NaN or infinite"):
        check_finite(fine, 10)


@pytest.mark.parametrize("debug, reduction", [(False, "auto"), (True, "auto"),
                                              pytest.param(False, "ring", marks=pytest.mark.slow)])
def test_a_killed_gmi_prints_two_lines_and_resume_continues(tmp_path, debug, reduction):
    """With a gloo ring the killed GMI's peer raises a connection error at once: the killed
    GMI is still the one named."""
    run = tmp_path / "run"
    args = [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--env.task-id", "CartPole-v1",
            "--gmi.num-gmis", "2", "--gmi.reduction", reduction, "--env.num-envs", "4",
            "--algo.num-steps", "32",
            "--total-timesteps", "10000000", "--checkpoint.every", "1", "--no-compile",
            "--log.no-tensorboard", "--run-dir", str(run)] + (["--debug"] if debug else [])
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until_written(proc, run, "checkpoints/iteration-*.pt", "no checkpoint written")
        gmis = gmi_processes(proc.pid)
        assert len(gmis) == 2, gmis
        os.kill(gmis[-1], signal.SIGKILL)  # the newest GMI
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    last_two = lines[-2:]
    assert last_two[0] == ("gmi-drl train: GMI 1 was killed by signal 9 without a result; "
                           "the run was stopped")
    assert last_two[1].strip() == (f"continue with: gmi-drl train ppo --resume {run}   "
                                   f"(traceback: {run / 'train.log'})")
    assert ("Traceback" in err) == debug  # the terminal shows it only with --debug
    assert "GMIError: GMI " in (run / "train.log").read_text()
    if debug:
        return
    done = load_checkpoint(run)["global_step"]  # (how far the run got depends on the host)
    resumed = subprocess.run([sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--resume",
                              str(run), "--total-timesteps", str(done + 512)], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "done: " in resumed.stdout


def test_ctrl_c_while_the_gmis_start_prints_no_traceback(tmp_path):
    """Ctrl-C as the first GMI starts: the fork server is still importing torch (it ignores the
    signal only after that), and the controller waits for the GMI's pid before it stops."""
    from tests.procs import assert_group_gone, signal_group, start_cli

    shm_before = shm_entries()
    proc = start_cli(["train", "ppo", "--gmi.num-gmis", "2", "--total-timesteps", "100000",
                      "--no-compile", "--log.no-tensorboard", "--run-dir", str(tmp_path / "run")],
                     tmp_path)

    def starting():
        line = proc.stderr.readline()
        while line and "run directory:" not in line:  # printed just before the GMIs start
            line = proc.stderr.readline()
        time.sleep(0.3)

    err = signal_group(proc, starting, signal.SIGINT, timeout_s=60)
    assert proc.returncode == 130, err
    assert "gmi-drl train: interrupted; the run was stopped" in err
    assert "Traceback" not in err and "Error" not in err, err
    assert_group_gone(proc.pid, shm_before, tmp_path)


def test_blocks_a_killed_run_left_are_reclaimed_and_live_ones_kept(tmp_path):
    """kill -9 of a run's whole process group (its resource tracker too) runs no clean-up;
    the next run unlinks the blocks whose creator is gone."""
    from gmi_drl import blocks
    from tests.procs import group_members, shm_held, signal_group, start_cli

    def ours():
        return {n for n in os.listdir("/dev/shm") if n.startswith("gmidrl_")}

    left, semaphores = set(), set()

    def started():  # the run's blocks and semaphores, as its processes hold them before the kill
        wait_until_written(proc, run, "metrics.csv", "did not start")
        held = shm_held(group_members(proc.pid))
        left.update(n for n in held if n.startswith("gmidrl_"))
        semaphores.update(n for n in held if n.startswith("sem.mp-"))

    run = tmp_path / "run"
    proc = start_cli(["train", "ppo", "--gmi.num-gmis", "2", "--total-timesteps", "100000000",
                      "--no-compile", "--log.no-tensorboard", "--run-dir", str(run)], tmp_path)
    signal_group(proc, started, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_members(proc.pid):
        assert time.monotonic() < deadline, "the killed group's processes did not end"
        time.sleep(0.1)
    assert left, "the run held no block: nothing to reclaim"
    live = blocks.create(64)  # this process's: kept
    try:  # (under pytest-xdist a run beside this test may have reclaimed some already; what
        # it left, none reclaimed: whatever reclaims, a killed run's blocks must go)
        assert set(blocks.reclaim_orphans()) >= left & ours()
        assert not (ours() & left) and live.name in ours()
    finally:
        live.close()
        live.unlink()
        # the killed run's multiprocessing semaphores (its queues, barriers): its resource
        # tracker died with it, and they name no creator to reclaim by; the test removes them
        # at once (tests beside it under pytest-xdist wait a few seconds for what no one holds)
        for name in semaphores:
            try:
                os.unlink(f"/dev/shm/{name}")
            except FileNotFoundError:
                pass


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    """timeout(1) and systemd stop with SIGTERM to the controller alone: its GMIs stop, the
    run names how to resume, and the exit status is 128 + SIGTERM."""
    shm_before = shm_entries()
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gmi_drl.cli", "train", "ppo", "--env.task-id", "CartPole-v1",
         "--gmi.num-gmis", "2", "--total-timesteps", "100000000", "--checkpoint.every", "1",
         "--no-compile", "--log.no-tensorboard", "--run-dir", str(run)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_written(proc, run, "checkpoints/iteration-*.pt", "no checkpoint written")
        gmis = gmi_processes(proc.pid)
        assert len(gmis) == 2, gmis
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "gmi-drl train: interrupted; the run was stopped" in err
    assert f"continue with: gmi-drl train ppo --resume {run}" in err
    for pid in gmis:  # gone, or a zombie waiting to be reaped
        try:
            with open(f"/proc/{pid}/stat") as f:
                assert f.read().rsplit(")", 1)[1].split()[0] == "Z", pid
        except FileNotFoundError:
            pass
    assert not shm_left(shm_before)


@pytest.mark.parametrize("layout", [["--gmi.num-gmis", "2"],  # GMIs from the fork server
                                    ["--env.engine", "gymnasium"]])  # env workers forked here
def test_a_hangup_stops_a_run_as_ctrl_c_does_and_leaves_nothing(tmp_path, layout):
    """The terminal or SSH session closed: SIGHUP reaches the whole group; the GMIs, their env
    workers, the fork server and multiprocessing's resource tracker ignore it, the controller
    stops the run."""
    from tests.procs import assert_group_gone, signal_group, start_cli

    shm_before = shm_entries()
    run = tmp_path / "run"
    proc = start_cli(["train", "ppo", *layout, "--total-timesteps", "100000000",
                      "--checkpoint.every", "1", "--no-compile", "--log.no-tensorboard",
                      "--run-dir", str(run)], tmp_path)
    err = signal_group(proc, lambda: wait_until_written(
        proc, run, "checkpoints/iteration-*.pt", "no checkpoint written"), signal.SIGHUP)
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "gmi-drl train: interrupted; the run was stopped" in err
    assert f"continue with: gmi-drl train ppo --resume {run}" in err
    assert "Traceback" not in err, err
    assert_group_gone(proc.pid, shm_before, tmp_path)


def test_a_switch_that_does_not_answer_is_one_line_naming_it():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(SwitchError) as err:
        SwitchReducer(f"127.0.0.1:{port}", 0, 2, join_timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    tb = "".join(traceback.format_exception(err.value))
    summary = GMIError.raised(0, tb).summary
    assert summary.startswith(f"GMI 0 raised SwitchError: worker 0: no complete group at switch "
                              f"127.0.0.1:{port} within 0.5 s (the switch never answered: "
                              "is one running there (gmi-drl switch serve --bind "
                              f"127.0.0.1:{port})")
    assert "\n" not in summary


@pytest.mark.parametrize("to", ["process", "gmi thread"])
def test_ctrl_c_stops_every_gmi_thread_of_a_serial_run(to):
    """Ctrl-C reaches only the main thread, waiting for the GMI threads: the serial placement
    raises it in every one (GMI 0 included, whose join the signal cut short) and waits for
    them, so none trains on into the exit. The kernel may hand the signal to a GMI thread
    (``gmi thread``): the main thread's wait must still wake to run Python's handler."""
    from gmi_drl.gmi.context import ReductionGroup
    from gmi_drl.gmi.devices import Machine
    from gmi_drl.gmi.layout import plan
    from gmi_drl.runner.placement import SerialPlacement
    from gmi_drl.runner.template import SyncTemplate
    from tests.gmi import gmi_targets

    layout = plan(3, Machine((), tuple(sorted(os.sched_getaffinity(0))), "no GPU: test"))
    cfg = preset("classic", "CartPole-v1")
    template = SyncTemplate(cfg, layout, 1024)
    template.target = "tests.gmi.gmi_targets:spin_until_interrupted"
    placement = SerialPlacement(cfg, template)
    gmi_targets.INTERRUPTED.clear()

    def ctrl_c():
        if to == "process":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            gmi = next(t for t in threading.enumerate() if t.name == "gmi-1")
            signal.pthread_kill(gmi.ident, signal.SIGINT)

    threading.Timer(0.5, ctrl_c).start()
    # a wait that the signal does not wake would hang the test: wake it at 6 s, and fail
    rescue = threading.Timer(6.0, signal.pthread_kill,
                             (threading.main_thread().ident, signal.SIGINT))
    rescue.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            placement._threads(None, ReductionGroup())
    finally:
        rescue.cancel()
    assert time.monotonic() - t0 < 5
    assert gmi_targets.INTERRUPTED == {0, 1, 2}
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gmi-")]


def test_a_gmi_stopped_from_outside_is_named_so_not_as_a_raised_systemexit():
    tb = "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nSystemExit: 143\n"
    assert GMIError.raised(1, tb).summary == ("GMI 1 was stopped by SIGTERM from outside the "
                                              "run; the run was stopped")
    assert GMIError.raised(1, tb.replace("143", "3")).summary == (
        "GMI 1 raised SystemExit: 3; the run was stopped")  # a target's own exit code


def test_a_run_whose_directory_was_removed_says_so(tmp_path):
    from gmi_drl.runner.run import Run

    stopped = RunStopped(Run(tmp_path / "removed", preset("classic")), OSError(2, "gone"))
    assert stopped.next_step == (f"its directory {tmp_path / 'removed'} is gone (removed while "
                                 "the run trained), checkpoints and train.log with it: start "
                                 "the run again")
