"""The profiler: selection by iteration / rank / role, capture ranges, fallbacks, nsys and Ray
commands."""

import json
import logging
import os
import shutil
import stat

import pytest
import torch
import tyro

from gmi_drl.config import ConfigError, TrainConfig, validate
from gmi_drl.telemetry import Timeline, TimingTree, set_tree, timer
from gmi_drl.telemetry.profiler import (PHASE_ROLES, ROLES, CaptureProfiler, NoOpProfiler,
                                        ProfilerConfig, make_profiler, nsight_runtime_env,
                                        nsys_command, phase_roles, should_capture)

LOOP = ("rollout", "advantages", "update", "log")  # the training loop's phases, in order


class RecordingCapture:
    """A capture tool that records what it was asked to do."""

    def __init__(self):
        self.calls = []

    def start(self, label):
        self.calls.append(("start", label))

    def stop(self):
        self.calls.append(("stop",))


def _run_iterations(prof, iterations, phases=LOOP, raise_in=None):
    """Drive ``prof`` like the training loop; return the timer paths that closed, in order."""
    tree = TimingTree(Timeline())
    previous = set_tree(tree)
    try:
        for k in iterations:
            with prof.iteration(k):
                for name in phases:
                    with prof.phase(name):
                        with timer("inner"):
                            if (k, name) == raise_in:
                                raise RuntimeError("boom")
    finally:
        set_tree(previous)
        prof.close()
    return [p for p, _, _ in tree.timeline.events]


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    """An executable ``nsys`` on PATH that logs its arguments and runs the wrapped command."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "nsys-args.txt"
    script = bin_dir / "nsys"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\nshift\n'
                      'while case "$1" in -*) true;; *) false;; esac; do shift; done\n'
                      'FAKE_NSYS=1 exec "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return script, log


@pytest.fixture
def no_nsys(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_selection_by_iteration_rank_and_role():
    cfg = ProfilerConfig(tool="nsys", iterations=[3, 4], ranks=[0, 2], roles=["trainer"])
    assert should_capture(cfg, 3, 0, "trainer") and should_capture(cfg, 4, 2, "trainer")
    assert not should_capture(cfg, 5, 0, "trainer")  # iteration not chosen
    assert not should_capture(cfg, 3, 1, "trainer")  # rank not chosen
    assert not should_capture(cfg, 3, 0, "simulator")  # role not chosen
    cfg.all_ranks = True
    assert should_capture(cfg, 3, 1, "trainer") and should_capture(cfg, 3, 7, "trainer")
    cfg.tool = "none"
    assert not any(should_capture(cfg, s, r, role) for s in range(6) for r in range(3)
                   for role in ROLES)
    with pytest.raises(ValueError, match="role 'learner' must be one of"):
        should_capture(cfg, 3, 0, "learner")


def test_every_phase_belongs_to_roles_and_unknown_phases_are_refused():
    assert set(PHASE_ROLES) == {"rollout", "advantages", "update", "log", "checkpoint"}
    assert phase_roles("rollout") == ("simulator", "agent")
    assert all(phase_roles(p) == ("trainer",) for p in ("advantages", "update", "log"))
    with pytest.raises(ValueError, match="phase 'evaluate' has no roles"):
        phase_roles("evaluate")


def test_one_capture_per_selected_iteration_spanning_its_phases(tmp_path):
    cap = RecordingCapture()
    prof = CaptureProfiler(ProfilerConfig(tool="nsys", iterations=[1, 3]), 0, cap, tmp_path)
    paths = _run_iterations(prof, range(5))
    assert cap.calls == [("start", "iteration-1"), ("stop",), ("start", "iteration-3"), ("stop",)]
    assert paths.count("update/inner") == 5  # every phase is still a timer section
    written = json.loads((tmp_path / "captures.json").read_text())
    assert [(c["index"], c["label"], c["iteration"], c["phases"]) for c in written] == [
        (1, "iteration-1", 1, list(LOOP)), (2, "iteration-3", 3, list(LOOP))]
    assert all(c["dur_s"] >= 0 and c["start_unix_s"] > 0 for c in written)


def test_roles_select_phases_and_discrete_opens_one_capture_per_phase(tmp_path):
    cap = RecordingCapture()
    cfg = ProfilerConfig(tool="nsys", iterations=[2], roles=["simulator"])
    _run_iterations(CaptureProfiler(cfg, 0, cap, tmp_path), range(4))
    assert cap.calls == [("start", "iteration-2"), ("stop",)]  # rollout only, closed at advantages

    cap = RecordingCapture()
    cfg = ProfilerConfig(tool="nsys", iterations=[2], roles=["trainer"], discrete=True)
    _run_iterations(CaptureProfiler(cfg, 0, cap, tmp_path), range(4))
    assert cap.calls == [("start", "iteration-2-advantages"), ("stop",), ("start", "iteration-2-update"),
                         ("stop",), ("start", "iteration-2-log"), ("stop",)]


def test_a_run_that_raises_mid_iteration_closes_its_capture(tmp_path):
    cap = RecordingCapture()
    prof = CaptureProfiler(ProfilerConfig(tool="nsys", iterations=[0]), 0, cap, tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        _run_iterations(prof, [0], raise_in=(0, "update"))
    assert cap.calls == [("start", "iteration-0"), ("stop",)]


def test_a_tool_that_fails_to_start_is_reported_as_its_own_error(tmp_path):
    class Failing(RecordingCapture):
        def start(self, label):
            raise RuntimeError("the tool could not start")

    prof = CaptureProfiler(ProfilerConfig(tool="nsys", iterations=[0]), 0, Failing(), tmp_path)
    with pytest.raises(RuntimeError, match="the tool could not start"):
        _run_iterations(prof, [0])


def test_unselected_or_off_gives_the_no_op_profiler(tmp_path):
    tree = TimingTree()
    assert isinstance(make_profiler(ProfilerConfig(), 0, tmp_path, tree), NoOpProfiler)
    cfg = ProfilerConfig(tool="torch", ranks=[1])
    assert isinstance(make_profiler(cfg, 0, tmp_path, tree), NoOpProfiler)
    assert tree.ranges == "none"
    noop = NoOpProfiler()
    assert noop.iteration(0) is noop.iteration(1)  # one shared null context
    _run_iterations(noop, range(2))
    assert not tmp_path.joinpath("captures.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback where CUDA is absent")
def test_nsys_without_cuda_falls_back_with_a_warning_and_keeps_nvtx(tmp_path, caplog):
    tree = TimingTree()
    with caplog.at_level(logging.WARNING):
        prof = make_profiler(ProfilerConfig(tool="nsys"), 0, tmp_path, tree)
    assert isinstance(prof, NoOpProfiler)
    assert "needs a CUDA device" in caplog.text and "NVTX ranges on" in caplog.text
    assert tree.ranges == "nvtx"
    tree = TimingTree()
    make_profiler(ProfilerConfig(tool="nsys", nvtx=False), 0, tmp_path, tree)
    assert tree.ranges == "none"


def test_torch_profiler_writes_one_chrome_trace_per_capture_with_the_phases(tmp_path):
    tree = TimingTree(Timeline())
    cfg = ProfilerConfig(tool="torch", iterations=[1])
    prof = make_profiler(cfg, 0, tmp_path, tree)
    previous = set_tree(tree)
    try:
        for k in range(3):
            with prof.iteration(k):
                for name in ("rollout", "update"):
                    with prof.phase(name):
                        with timer("forward"):
                            torch.ones(8, 8).mm(torch.ones(8, 8))
    finally:
        set_tree(previous)
        prof.close()
    assert tree.ranges == "none"  # record_function ranges only while capturing
    trace = json.loads((tmp_path / "torch-iteration-1.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"rollout", "update", "forward", "aten::mm"} <= names
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captures.json", "torch-iteration-1.json"]


def test_timer_opens_nvtx_ranges_of_the_same_name_when_asked(monkeypatch):
    import nvtx

    calls = []
    monkeypatch.setattr(nvtx, "push_range", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(nvtx, "pop_range", lambda: calls.append(("pop",)))
    tree = TimingTree(ranges="nvtx")
    previous = set_tree(tree)
    try:
        with timer("rollout"):
            with timer("env_step"):
                pass
        tree.set_ranges("none")
        with timer("log"):
            pass
    finally:
        set_tree(previous)
    assert calls == [("push", "rollout"), ("push", "env_step"), ("pop",), ("pop",)]
    assert tree.calls == {"rollout/env_step": 1, "rollout": 1, "log": 1}
    with pytest.raises(ValueError, match="range kind 'vtune'"):
        tree.set_ranges("vtune")


def test_nsys_command_for_a_local_gmi(fake_nsys, tmp_path):
    script, _ = fake_nsys
    cfg = ProfilerConfig(tool="nsys", ranks=[1])
    cmd = nsys_command(cfg, 1, tmp_path / "run")
    assert cmd[:2] == [str(script), "profile"]
    assert {"--trace=cuda,nvtx,osrt", "--capture-range=cudaProfilerApi",
            "--capture-range-end=repeat"} <= set(cmd)
    assert cmd[-1] == f"--output={(tmp_path / 'run').resolve()}/profile/gmi-1/gmi-1-%p"
    assert all(a.startswith("--") for a in cmd[2:])  # --name=value only: no value stands alone
    assert nsys_command(cfg, 0, tmp_path) is None  # rank 0 not selected
    assert nsys_command(ProfilerConfig(tool="torch"), 0, tmp_path) is None


def test_ray_runtime_env_for_an_actor(fake_nsys, tmp_path):
    env = nsight_runtime_env(ProfilerConfig(tool="nsys", all_ranks=True), 3, tmp_path / "my run")
    assert env == {"nsight": {"trace": "cuda,nvtx,osrt", "capture-range": "cudaProfilerApi",
                              "capture-range-end": "repeat", "o": "my_run-gmi-3-%p"}}
    assert nsight_runtime_env(ProfilerConfig(tool="nsys"), 3, tmp_path) is None  # rank 0 only


def test_no_nsys_on_path_gives_none_and_a_warning(no_nsys, tmp_path, caplog):
    cfg = ProfilerConfig(tool="nsys")
    with caplog.at_level(logging.WARNING):
        assert nsys_command(cfg, 0, tmp_path) is None
        assert nsight_runtime_env(cfg, 0, tmp_path) is None
    assert caplog.text.count("nsys is not on PATH") == 2
    assert "Ray actor of GMI 0" in caplog.text


def test_cli_flags_parse_and_bad_profile_config_is_reported_field_by_field():
    cfg = tyro.cli(TrainConfig, args=["--profile.tool", "nsys", "--profile.iterations", "3", "4",
                                      "--profile.ranks", "0", "--profile.roles", "trainer",
                                      "--profile.discrete", "--total-timesteps", "5120"])
    p = cfg.profile
    assert (p.tool, p.iterations, p.ranks, p.roles, p.discrete, p.all_ranks) == (
        "nsys", [3, 4], [0], ["trainer"], True, False)
    validate(cfg)
    p.iterations, p.ranks, p.roles = [3, 10, -1], [0, 2], []
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    msg = str(err.value)
    assert "profile.iterations=[3, 10, -1]: [10, -1] outside the run's iterations [0, " \
           "num_iterations=10)" in msg
    assert "profile.ranks=[0, 2]: [2] outside the GMI ids [0, gmi.num_gmis=1)" in msg
    assert "profile.roles=[] must be a non-empty subset" in msg
    p.iterations, p.ranks, p.roles, p.all_ranks = [], [], ["agent"], True
    with pytest.raises(ConfigError, match="profile.iterations is empty") as err:
        validate(cfg)
    assert "profile.ranks" not in str(err.value)  # all_ranks makes ranks irrelevant
    p.tool = "none"  # the other fields set, which nothing would read
    with pytest.raises(ConfigError, match=r"profile.iterations, profile.ranks, profile.all_ranks, "
                       r"profile.roles, profile.discrete set but profile.tool='none'"):
        validate(cfg)
    cfg.config = "tuned.json"  # a config file's fields are not the user's flags
    validate(cfg)
    cfg.config, cfg.profile = None, ProfilerConfig(tool="torch", nvtx=False)
    with pytest.raises(ConfigError, match="NVTX ranges are for nsys"):
        validate(cfg)
    cfg.config = "config.json"  # a stored nsys run's no-nvtx, now profiled with torch
    validate(cfg)


def test_a_file_where_the_run_writes_a_directory_is_refused_before_it_starts(tmp_path):
    cfg = tyro.cli(TrainConfig, args=["--profile.tool", "torch", "--total-timesteps", "5120"])
    cfg.run_dir = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "profile").write_text("")
    with pytest.raises(ConfigError, match=r"/run/profile is a file where the run writes a "
                       "directory"):
        validate(cfg)
    cfg.profile.tool = "none"  # no profile directory then
    validate(cfg)
    cfg.run_dir = str(tmp_path / "run" / "profile")
    with pytest.raises(ConfigError, match="is a file where the run writes a directory"):
        validate(cfg)


@pytest.mark.distributed
def test_the_launcher_runs_the_selected_gmi_under_nsys(fake_nsys, tmp_path):
    from gmi_drl.gmi.devices import discover
    from gmi_drl.gmi.launcher import launch
    from gmi_drl.gmi.layout import plan

    _, args_log = fake_nsys
    cfg = ProfilerConfig(tool="nsys", ranks=[1])
    prefixes = {k: c for k in (0, 1) if (c := nsys_command(cfg, k, tmp_path)) is not None}
    m = discover()
    out = launch("tests.gmi.gmi_targets:reduce_and_report_wrapper", plan(2, m), m,
                 prefixes=prefixes)
    assert out == [(None, [0.5] * 3), ("1", [0.5] * 3)]  # GMI 1 under nsys, still reducing
    (line,) = args_log.read_text().splitlines()
    assert line.startswith("profile --trace=cuda,nvtx,osrt --capture-range=cudaProfilerApi")
    assert f"--output={tmp_path.resolve()}/profile/gmi-1/gmi-1-%p " in line
    assert "--multiprocessing-fork" in line  # spawn's own arguments reach the interpreter


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs CUDA: capture ranges are cudaProfilerStart/Stop")
def test_cuda_capture_ranges_around_the_selected_iteration(tmp_path):
    tree = TimingTree(Timeline())
    prof = make_profiler(ProfilerConfig(tool="nsys", iterations=[1]), 0, tmp_path, tree)
    assert isinstance(prof, CaptureProfiler) and tree.ranges == "nvtx"
    x = torch.ones(256, 256, device="cuda")
    previous = set_tree(tree)
    try:
        for k in range(3):
            with prof.iteration(k):
                with prof.phase("update"):
                    with timer("forward"):
                        x = x.mm(x).tanh()
    finally:
        set_tree(previous)
        prof.close()
    (entry,) = json.loads((tmp_path / "captures.json").read_text())
    assert (entry["label"], entry["phases"]) == ("iteration-1", ["update"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("nsys") is None,
                    reason="needs CUDA and Nsight Systems (nsys on PATH)")
def test_a_profiled_run_under_real_nsys_writes_reports(tmp_path):
    from gmi_drl.config import preset
    from gmi_drl.train import train

    cfg = preset("classic", "CartPole-v1")
    cfg.total_timesteps, cfg.device, cfg.log.tensorboard = 3 * 512, "cuda", False
    cfg.run_dir = str(tmp_path / "run")
    cfg.profile.tool, cfg.profile.iterations = "nsys", [1, 2]
    train(cfg)
    reports = sorted((tmp_path / "run" / "profile" / "gmi-0").glob("*.nsys-rep"))
    assert len(reports) == 2, reports  # one per capture range (--capture-range-end=repeat)


def test_training_runs_the_selected_gmis_under_nsys_only_where_nvml_sees_a_gpu(
        fake_nsys, tmp_path, monkeypatch, caplog):
    from gmi_drl.gmi import devices
    from gmi_drl.runner.placement import _nsys_prefixes

    cfg = TrainConfig()
    cfg.gmi.num_gmis, cfg.profile.tool, cfg.profile.ranks = 3, "nsys", [0, 2]
    with caplog.at_level(logging.WARNING):
        assert _nsys_prefixes(cfg, tmp_path, devices.Machine((), (0,), "no GPU: test")) == {}
    assert "no GPU: test: nsys capture ranges need CUDA" in caplog.text
    gpu = devices.Gpu(0, "Fake GPU", "GPU-0")
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    with caplog.at_level(logging.WARNING):  # a GPU, but a torch that cannot start a capture
        assert _nsys_prefixes(cfg, tmp_path, devices.Machine((gpu,), (0,))) == {}
    assert "torch is a CPU build (no CUDA): nsys capture ranges need CUDA" in caplog.text
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    prefixes = _nsys_prefixes(cfg, tmp_path, devices.Machine((gpu,), (0,)))
    assert sorted(prefixes) == [0, 2] and prefixes[2] == nsys_command(cfg.profile, 2, tmp_path)
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["gmi-0", "gmi-2"]
