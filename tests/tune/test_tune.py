"""Algorithm 2 (GMI-DRL §5.2) against synthetic profiles, and `gmi-drl tune` on real probes."""

import json
import math
import os
import threading
import time
from pathlib import Path

import pytest

from gmi_drl.config import ConfigError, load_config_file, preset, to_dict
from gmi_drl.tune import probe
from gmi_drl.tune import processes as tune_processes
from gmi_drl.tune import (Point, PointCache, ProbeFailed, Tuner, TuneOptions, envs_grid,
                              run_probe, saturation, search, tune)
from tests.procs import confined_tmp, group_members, shm_entries, shm_left


class Profile:
    """A synthetic profile: ``table[(gmis, num_envs)] = (top, mem)`` or None (not runnable);
    records every call."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def __call__(self, gmis, num_envs):
        self.calls.append((gmis, num_envs))
        got = self.table.get((gmis, num_envs))
        if got is None:
            return Point(gmis, num_envs, False, reason="out of memory")
        return Point(gmis, num_envs, True, *got)


def estimate_calls(log):
    def estimate(gmis, point):
        log.append((gmis, point.num_envs))
        return point.top * gmis
    return estimate


def test_unrunnable_skipped_first_runnable_only_initialises_saturation_stops():
    table = {(2, 2): None,                       # skipped (lines 6-8)
             (2, 4): (100, 1000),                # first runnable: initialises only
             (2, 8): (200, 1100),                # Sat = 1.0 / 0.1 = 10 -> estimated
             (2, 16): (205, 2200),               # Sat = 0.025 / 1 < 0.1 -> stop
             (2, 32): (900, 2300)}               # never profiled
    profile, log = Profile(table), []
    result = search([2], [2, 4, 8, 16, 32], profile, estimate_calls(log), alpha=0.1)
    assert profile.calls == [(2, 2), (2, 4), (2, 8), (2, 16)]
    assert log == [(2, 8)]
    assert result.best == (8, 2) and result.best_estimate == 400
    sats = {p.num_envs: p.sat for p in result.points}
    assert sats[4] is None and sats[8] == pytest.approx(10) and sats[16] == pytest.approx(0.025)


def test_best_estimate_wins_over_gmi_counts_and_ties_keep_the_earlier_point():
    table = {(2, 2): (100, 100), (2, 4): (150, 200),    # estimate 300
             (1, 2): (100, 100), (1, 4): (300, 200)}    # estimate 300: a tie, (4, 2) stays
    result = search([2, 1], [2, 4], Profile(table), estimate_calls([]))
    assert result.best == (4, 2)
    table[(1, 4)] = (301, 200)
    assert search([2, 1], [2, 4], Profile(table), estimate_calls([])).best == (4, 1)


def test_inner_loop_restarts_its_tracking_for_each_gmi_count():
    table = {(2, 2): (100, 100), (2, 4): (101, 200),    # saturated at once
             (1, 2): (10, 100), (1, 4): (20, 110)}
    profile = Profile(table)
    result = search([2, 1], [2, 4], profile, estimate_calls([]))
    assert profile.calls == [(2, 2), (2, 4), (1, 2), (1, 4)]
    assert result.best == (4, 1)


def test_no_point_estimated_and_the_budget():
    assert search([1], [2], Profile({(1, 2): (5, 5)}), estimate_calls([])).best is None
    profile, calls = Profile({}), iter([False, False, True])
    result = search([1], [2, 4, 8], profile, estimate_calls([]), over_budget=lambda: next(calls))
    assert result.budget_exhausted and profile.calls == [(1, 2), (1, 4)]


def test_saturation_when_memory_does_not_grow():
    assert saturation(0.5, 0.25) == 2
    assert saturation(0.1, 0.0) == math.inf
    assert saturation(0.0, 0.0) == -math.inf
    assert saturation(-0.1, -0.2) == -math.inf


def test_the_gpu_grid_is_for_envs_that_step_on_the_gpu():
    from gmi_drl.tune import envs_on_device

    hopper = preset("auto", "Hopper-v5", "ppo")
    hopper.device = "cuda"  # a GPU learner: Hopper's envs still step on CPU cores
    assert not envs_on_device(hopper)
    ant = preset("gmi-ant")
    assert ant.env.engine == "warp" and envs_on_device(ant)
    ant.env.engine = "auto"  # the warp tasks' only engine
    assert envs_on_device(ant)


def test_envs_grid():
    assert envs_grid(2, 256) == [2, 4, 8, 16, 32, 64, 128, 256]
    assert envs_grid(128, 300) == [128, 256]
    with pytest.raises(ValueError):
        envs_grid(0, 4)


def test_point_cache_round_trips_and_keeps_other_keys(tmp_path):
    path = tmp_path / "cache.json"
    cache = PointCache(path, "k1")
    cache.put(Point(2, 8, True, 123.0, 456.0, terms={"t_s": 0.1}))
    again = PointCache(path, "k1").get(2, 8)
    assert again.cached and again.top == 123.0 and again.terms == {"t_s": 0.1}
    other = PointCache(path, "k2")  # another job tuned into the same --out
    assert other.get(2, 8) is None
    other.put(Point(1, 4, True, 9.0, 10.0))
    assert PointCache(path, "k1").get(2, 8).top == 123.0  # not wiped by k2's search
    assert PointCache(path, "k2").get(1, 4).top == 9.0
    fresh = PointCache(path, "k1", fresh=True)  # measured again, k2's kept
    assert fresh.get(2, 8) is None
    fresh.put(Point(2, 16, True, 5.0, 6.0))
    assert PointCache(path, "k1").get(2, 8) is None and PointCache(path, "k2").get(1, 4)


@pytest.mark.parametrize("edit", [{"top": None}, {"mem": 0}, {"gmis": "2"}, {"top": "fast"},
                                  {"runnable": False}, {"top": math.inf}, {"extra": 1},
                                  {"terms": {"t_s": "x"}}, {"num_envs": 16}])
def test_a_cache_entry_edited_out_of_shape_is_measured_again(tmp_path, edit):
    path = tmp_path / "cache.json"
    PointCache(path, "k").put(Point(2, 8, True, 123.0, 456.0, terms={"t_s": 0.1}))
    data = json.loads(path.read_text())
    data["entries"]["k"]["2,8"].update(edit)
    path.write_text(json.dumps(data))
    assert PointCache(path, "k").get(2, 8) is None


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 3, "entries": []}'])
def test_a_file_that_is_not_a_cache_is_kept_aside_with_a_warning(tmp_path, text):
    path = tmp_path / "cache.json"
    path.write_text(text)
    with pytest.warns(UserWarning, match="not a tune cache.*kept as .*cache.json.bad"):
        cache = PointCache(path, "k")
    assert (tmp_path / "cache.json.bad").read_text() == text and not path.exists()
    cache.put(Point(1, 2, True, 1.0, 2.0))
    assert PointCache(path, "k").get(1, 2).top == 1.0


def test_a_point_of_no_memory_initialises_again_instead_of_dividing_by_it():
    profile = Profile({(1, 2): (10.0, 0.0), (1, 4): (20.0, 100.0), (1, 8): (40.0, 110.0)})
    result = search([1], [2, 4, 8], profile, estimate_calls([]))
    assert [p.sat for p in result.points][:2] == [None, None]
    assert result.points[2].sat == pytest.approx(1.0 / 0.1)
    assert result.best == (8, 1)


def test_a_point_that_failed_is_measured_again_not_cached(tmp_path):
    """A failure may be the options' doing (a probe limit too short): a later search with
    other options must not inherit it."""
    cfg = preset("auto", "CartPole-v1", "ppo")
    cache = PointCache(tmp_path / "cache.json", "k")
    point = Tuner(cfg, timeout_s=0.5, cache=cache).profile(1, 2)
    assert not point.runnable and "hung" in point.reason
    assert PointCache(tmp_path / "cache.json", "k").get(1, 2) is None


@pytest.mark.slow
def test_a_probe_that_hangs_is_killed_at_its_limit_and_leaves_no_process(tmp_path, monkeypatch):
    """... nor its GMIs' shared memory and semaphores in /dev/shm (SIGKILL to the whole group
    took the resource tracker that unlinks them), nor its temporary directories (the scratch
    run directory, the launcher's, multiprocessing's)."""
    shm_before = shm_entries()
    # the probe's temporary directories go here; torch.compile's caches stay where they were
    confined = confined_tmp(tmp_path)
    scratch = Path(confined["TMPDIR"])
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", confined["TORCHINDUCTOR_CACHE_DIR"])
    monkeypatch.setenv("TMPDIR", confined["TMPDIR"])
    cfg = preset("auto", "CartPole-v1", "ppo")
    cfg.gmi.num_gmis, cfg.env.num_envs = 2, 2
    started = []
    real_forked = tune_processes._Forked

    def forked(process):  # remember the probe's process group
        started.append(process.pid)
        return real_forked(process)

    monkeypatch.setattr("gmi_drl.tune.processes._Forked", forked)
    most, done = [0], threading.Event()

    def watch():  # the probe's group while it runs: the probe and its second GMI's process
        while not done.is_set():
            if started:
                most[0] = max(most[0], len(group_members(started[0], zombies=False)))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ProbeFailed, match=r"hung: still running after 15 s \(killed\) "
                           r"(at step [\d,]+/[\d,]+|before its first update)"):
            run_probe(to_dict(cfg), warmup=1, iterations=10**6, timeout_s=15, min_steps=10**9)
    finally:
        done.set()
        watcher.join()
    assert time.perf_counter() - t0 < 30
    assert most[0] >= 2, "the probe never started its GMI processes: the test proves nothing"
    time.sleep(0.5)
    assert group_members(started[0], zombies=False) == []
    assert not shm_left(shm_before)
    # gmi-drl's and multiprocessing's (torch.compile's C++ builder keeps header locks there, and
    # a compiler killed with the probe its temporary files, neither the probe's to remove)
    left = [name for name in os.listdir(scratch) if name.startswith(("gmi-drl-", "pymp-"))]
    assert left == [], [str(p) for p in scratch.rglob("*")][:20]


def test_a_probe_returns_once_its_result_is_written_and_leaves_no_process(monkeypatch):
    """The figures are whole once RESULT.json is there: `run_probe` takes them without waiting
    out the probe's teardown, and stops what is left of its group."""
    started = []
    real_forked = tune_processes._Forked

    def forked(process):
        started.append(process.pid)
        return real_forked(process)

    monkeypatch.setattr("gmi_drl.tune.processes._Forked", forked)
    t0 = time.perf_counter()
    assert run_probe({}, warmup=1, iterations=1, timeout_s=30,
                     target="tests.gmi.gmi_targets:probe_that_lingers") == {"top": 7.0}
    assert time.perf_counter() - t0 < 10
    pgid = started[0]  # the probe leads its own session: its pid is its group
    for _ in range(20):
        if not group_members(pgid, zombies=False):
            break
        time.sleep(0.1)
    assert group_members(pgid, zombies=False) == []


@pytest.mark.parametrize("ignores_term", [False, True])
def test_a_probe_group_gets_sigterm_then_sigkill_after_the_grace(ignores_term):
    """SIGTERM ends a group that obeys it at once; what ignores it is SIGKILLed after the
    grace period, and nothing of the group is left either way."""
    import subprocess

    from gmi_drl.tune.processes import _kill_group

    trap = "trap '' TERM; " if ignores_term else ""
    proc = subprocess.Popen(["sh", "-c", trap + "sleep 60 & sleep 60 & wait"],
                            start_new_session=True)
    time.sleep(0.3)
    assert len(group_members(proc.pid, zombies=False)) == 3
    t0 = time.perf_counter()
    _kill_group(proc, grace_s=1.0)
    took = time.perf_counter() - t0
    assert (1.0 <= took < 3.0) if ignores_term else took < 0.9
    for _ in range(20):
        if not group_members(proc.pid, zombies=False):
            break
        time.sleep(0.1)
    assert group_members(proc.pid, zombies=False) == []


def test_a_dead_probes_reason_is_its_own_last_line_not_the_trackers_warning():
    from gmi_drl.tune.processes import _last_line

    log = ("step 128/1,024 | 900 sps\nRuntimeError: CUDA error: out of memory\n"
           "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: "
           "resource_tracker: There appear to be 1 leaked shared_memory objects to clean up "
           "at shutdown\n  warnings.warn('resource_tracker: There appear to be %d '\n")
    assert _last_line(log) == "RuntimeError: CUDA error: out of memory"
    assert _last_line("") == ""


def test_a_killed_probe_says_how_far_it_got():
    from gmi_drl.tune.processes import _how_far

    for log in ("", "W1126 a compiler warning\n"):
        assert _how_far(log).startswith("before its first update ended")
    log = ("step 2,048/65,536 (  3%) | 900 sps | return   n/a | 2s elapsed | ETA 1m10s\n"
           "step 4,096/65,536 (  6%) | 950 sps | return 21.0 | 4s elapsed | ETA 1m05s\n")
    said = _how_far(log)
    assert "at step 4,096/65,536 (  6%) after 2 update(s)" in said
    assert "--probe-timeout-s" in said


def test_a_probe_measures_min_seconds_at_the_previous_points_throughput(monkeypatch):
    """The search's first probe measures min_steps; the next ones at least min_seconds at the
    throughput of the previous runnable point of the same GMI count, else of the point with as
    many envs (not the last one measured: 2 x 64 envs is no guide to 1 x 4)."""
    asked = []

    def probe(config, warmup, iterations, timeout_s, min_steps):
        asked.append((config["gmi"]["num_gmis"], config["env"]["num_envs"], min_steps))
        return {"top": 1000.0 * config["env"]["num_envs"], "mem": 1.0}

    monkeypatch.setattr("gmi_drl.tune.tuner.run_probe", probe)
    tuner = Tuner(preset("classic", "CartPole-v1"), min_steps=500, min_seconds=2.0)
    for gmis, n in ((2, 4), (2, 8), (2, 64), (1, 4), (1, 16), (1, 8)):
        tuner.profile(gmis, n)
    # (1, 8): its own GMI count's previous point (1 x 4), not 2 x 8 with as many envs
    assert asked == [(2, 4, 500), (2, 8, 8000), (2, 64, 16000), (1, 4, 8000), (1, 16, 8000),
                     (1, 8, 8000)]


def test_a_probe_without_a_point_of_its_envs_is_judged_by_the_nearest_num_envs(monkeypatch):
    asked = []

    def probe(config, warmup, iterations, timeout_s, min_steps):
        gmis, n = config["gmi"]["num_gmis"], config["env"]["num_envs"]
        asked.append((gmis, n, min_steps))
        if (gmis, n) == (2, 4):
            raise ProbeFailed("exit status 1: out of memory")
        return {"top": 1000.0 * n, "mem": 1.0}

    monkeypatch.setattr("gmi_drl.tune.tuner.run_probe", probe)
    tuner = Tuner(preset("classic", "CartPole-v1"), min_steps=500, min_seconds=2.0)
    for gmis, n in ((2, 4), (2, 8), (2, 32), (1, 4)):
        tuner.profile(gmis, n)
    # 1 x 4: no 1-GMI point, 2 x 4 did not run; 2 x 8 is the nearest in num_envs
    assert asked == [(2, 4, 500), (2, 8, 500), (2, 32, 16000), (1, 4, 16000)]


def test_a_probe_that_crashes_is_not_runnable_with_the_reason():
    data = to_dict(preset("auto", "CartPole-v1", "ppo"))
    data["env"]["task_id"] = "NoSuchTask-v0"
    with pytest.raises(ProbeFailed, match="exit status 1"):
        run_probe(data, warmup=0, iterations=1, timeout_s=120)


def test_tune_on_real_probes_resumes_from_its_cache_and_trains_with_tuned_json(tmp_path,
                                                                              capsys):
    from gmi_drl.cli import main

    out = str(tmp_path / "tune")
    # --no-compile: what is tested here is the search, its cache and tuned.json, not the job
    assert main(["tune", "--env.task-id", "CartPole-v1", "--algo.num-steps", "32", "--no-compile",
                 "--max-gmis", "1", "--envs-min", "2", "--envs-max", "8", "--iterations", "1",
                 "--min-steps", "0", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "| 1 | 2 | yes |" in printed and "chosen (" in printed and "tuned.json" in printed

    cfg = preset("auto", "CartPole-v1", "ppo")
    cfg.algo.num_steps, cfg.compile = 32, False
    options = TuneOptions(max_gmis=1, envs_min=2, envs_max=8, warmup=1, iterations=1,
                          min_steps=0, out=out)
    t0 = time.perf_counter()
    report = tune(cfg, options)  # the command's points, from the cache: nothing runs
    assert time.perf_counter() - t0 < 5
    assert all(p.cached for p in report.search.points)
    # (1, 8) is looked at only where 4 envs ran enough faster than 2 (Sat >= alpha, Algorithm 2
    # lines 15-21): measured throughput, which a loaded host can flatten
    assert [(p.gmis, p.num_envs) for p in report.search.points][:2] == [(1, 2), (1, 4)]
    assert all(p.runnable and p.top > 0 and p.mem > 100 * 2**20 for p in report.search.points)
    assert report.chosen is not None and report.plot_path.exists()
    first = report.search.points[0].terms
    assert first["t_s"] > 0 and first["t_a"] > 0 and first["t_t"] > 0 and first["r_a"] > 0
    tuned = json.loads(report.tuned_path.read_text())
    assert tuned["config"]["env"]["num_envs"] == report.chosen.num_envs
    assert tuned["tune"]["num_envs"] == report.chosen.num_envs

    run_dir = tmp_path / "run"
    assert main(["train", "ppo", "--config", str(report.tuned_path), "--total-timesteps", "512",
                 "--run-dir", str(run_dir), "--checkpoint.every", "0"]) == 0
    stored = json.loads((run_dir / "config.json").read_text())
    assert stored["env"]["num_envs"] == report.chosen.num_envs
    assert stored["algo"]["ppo"]["num_steps"] == 32 and stored["total_timesteps"] == 512
    summary = (run_dir / "summary.md").read_text()
    assert "tuned by `gmi-drl tune`" in summary and str(report.tuned_path) in summary


def test_config_file_errors_say_what_to_do(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config_file(str(bad))
    with pytest.raises(ConfigError, match="No such file"):
        load_config_file(str(tmp_path / "missing.json"))
    bad.write_text(json.dumps({"config": {"algo": {"nope": {}}}}))
    with pytest.raises(ConfigError, match="algo 'nope' is none of"):
        load_config_file(str(bad))


@pytest.mark.slow
def test_tune_searches_serving_gmis_of_an_async_run(tmp_path):
    cfg = preset("classic", "CartPole-v1", "appo")
    cfg.compile = False
    # (one num_envs: the serving GMIs are this test's subject; the other tests search num_envs)
    options = TuneOptions(max_gmis=2, envs_min=4, envs_max=4, warmup=1, iterations=2,
                          min_steps=0, out=str(tmp_path))
    report = tune(cfg, options)
    assert [(p.gmis, p.num_envs) for p in report.search.points] == [(2, 4), (1, 4)]
    assert all(p.runnable and p.top > 0 for p in report.search.points)
    # the trainer's and both serving GMIs' peak memory: the largest
    assert all(p.mem > 100 * 2**20 for p in report.search.points)
    assert report.predictions == []  # Tables 4-5 model synchronous templates only
    assert "an async_training run" in report.no_model
    tuned = json.loads(report.tuned_path.read_text())["config"]
    assert tuned["gmi"]["serving_gmis"] == report.chosen.gmis
    assert tuned["gmi"]["trainer_gmis"] == 1 and tuned["env"]["num_envs"] == report.chosen.num_envs
    record = json.loads(report.tuned_path.read_text())["tune"]
    assert record["unit"] == "samples trained/s" and record["gmis_counted"] == "serving GMI(s)"
    with pytest.raises(ValueError, match="one device"):
        tune(cfg, TuneOptions(out=str(tmp_path), num_devices=2))


def test_timer_counts_process_cpu_seconds_per_phase():
    from gmi_drl.telemetry.timer import TimingTree, set_tree, timer

    for cpu in (True, False):
        previous = set_tree(TimingTree(cpu=cpu))
        with timer("busy"):  # spins for 0.2 s of this process's CPU, however loaded the host
            spun = time.process_time()
            while time.process_time() - spun < 0.2:
                pass
        with timer("idle"):
            time.sleep(0.2)
        tree = set_tree(previous)
        stats = tree.stats()
        if cpu:
            assert 0.2 <= stats["busy"].cpu_s <= stats["busy"].total_s + 0.05
            assert stats["idle"].cpu_s < 0.05
            assert set(tree.snapshot_cpu_s()) == {"busy", "idle"}
        else:
            assert stats["busy"].cpu_s is None and tree.snapshot_cpu_s() == {}


def test_probe_measure_splits_the_iteration_into_the_roles():
    from gmi_drl.tune.probe import measure

    def row(k):  # the warm-up iteration ends at 2 s, each later one takes 1 s: 0.5 s rollout
        return {"global_step": 100.0 * k, "wall_s": 1.0 + k, "perf/rollout_s": 0.5,
                "perf/rollout/env_step_s": 0.3, "perf/update_s": 0.3,
                "perf/update/allreduce_s": 0.1, "perf/advantages_s": 0.05, "perf/log_s": 0.05,
                "perf/rollout_cpu_s": 0.8, "perf/rollout/env_step_cpu_s": 0.6,
                "perf/update_cpu_s": 0.3, "perf/update/allreduce_cpu_s": 0.1,
                "perf/advantages_cpu_s": 0.05, "perf/log_cpu_s": 0.05}

    rows = [row(k) for k in range(1, 6)]
    got = measure(rows, warmup=1, batch_size=100, num_gmis=2)
    assert got["top"] == pytest.approx(400 / 4.0)
    assert got["samples"] == 50
    assert (got["t_s"], got["t_a"], got["t_comm"]) == pytest.approx((0.3, 0.2, 0.1))
    assert got["t_t"] == pytest.approx(1.0 - 0.5 - 0.1)  # the rest of the iteration
    assert got["r_s"] == pytest.approx(2.0) and got["r_a"] == pytest.approx(1.0)
    assert got["r_t"] == pytest.approx((0.3 + 0.05 + 0.05 - 0.1) / (0.3 + 0.05 + 0.05 - 0.1))
    with pytest.raises(ValueError, match="warm-up"):
        measure(rows[:1], warmup=1, batch_size=100, num_gmis=2)


@pytest.mark.parametrize("field, value, match", [
    ("max_gmis", 0, "--max-gmis 0 \\(needs >= 1\\)"), ("envs_min", 0, "--envs-min 0"),
    ("envs_max", 1, "--envs-min 2 \\(the default here\\) is above --envs-max 1: give both"),
    ("budget_s", 0.0, "--budget-s 0.0 \\(needs > 0 seconds\\)"),
    ("iterations", 0, "iterations"),
    ("probe_timeout_s", 0.0, "probe-timeout-s 0.0 \\(needs > 0\\)"),
    ("num_devices", -1, "num-devices -1"), ("bw", 0.0, "--bw 0.0"),
    ("min_seconds", math.inf, "--min-seconds inf \\(needs >= 0 and finite\\)"),
    ("num_devices", 2, "needs the bandwidth between them: pass --bw")])
def test_tune_refuses_bad_options_before_profiling(tmp_path, field, value, match):
    cfg = preset("auto", "CartPole-v1", "ppo")
    options = TuneOptions(out=str(tmp_path), **{"max_gmis": 1, field: value})
    with pytest.raises(ValueError, match=match):
        tune(cfg, options)
    assert not (tmp_path / "tune_cache.json").exists()


def test_tune_refuses_to_resume_a_run_and_a_probe_never_continues_one(tmp_path, capsys):
    """A probe that resumed the user's run would train it on and rewrite its files."""
    from gmi_drl.cli import main

    run = tmp_path / "run"
    assert main(["train", "ppo", "--env.task-id", "CartPole-v1", "--env.num-envs", "2",
                 "--algo.num-steps", "8", "--total-timesteps", "32", "--no-compile",
                 "--run-dir", str(run)]) == 0
    before = {f: f.stat().st_mtime_ns for f in run.rglob("*") if f.is_file()}
    capsys.readouterr()
    assert main(["tune", "--resume", str(run), "--max-gmis", "1",
                 "--out", str(tmp_path / "t")]) == 2
    assert "--resume is for gmi-drl train: tune measures fresh short runs" in (
        capsys.readouterr().err)
    assert main(["tune", "--run-dir", str(run), "--max-gmis", "1"]) == 2
    assert "--run-dir is for gmi-drl train" in capsys.readouterr().err
    cfg = preset("auto", "CartPole-v1", "ppo")
    cfg.env.num_envs, cfg.algo.num_steps, cfg.compile, cfg.resume = 2, 8, False, str(run)
    with pytest.raises(ValueError, match="tune measures fresh short runs"):
        tune(cfg, TuneOptions(out=str(tmp_path / "t"), max_gmis=1))  # the API refuses it too
    figures = probe.run(to_dict(cfg), warmup=0, iterations=1)
    assert figures["top"] > 0
    assert {f: f.stat().st_mtime_ns for f in run.rglob("*") if f.is_file()} == before


def test_tune_out_must_be_a_directory_and_a_fruitless_search_keeps_the_earlier_pick(tmp_path,
                                                                                    capsys):
    from gmi_drl.cli import main

    cfg = preset("auto", "CartPole-v1", "ppo")
    blocker = tmp_path / "afile"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        with pytest.raises(ValueError, match="is not a directory"):
            tune(cfg, TuneOptions(out=str(out)))
    assert main(["tune", "--out", str(blocker), "--max-gmis", "1"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    taken = tmp_path / "taken"
    (taken / "tune_cache.json").mkdir(parents=True)  # a name of tune's files is not a file
    assert main(["tune", "--out", str(taken), "--max-gmis", "1"]) == 2
    assert "tune_cache.json is not a file; move it, or give another --out" in (
        capsys.readouterr().err)
    t0 = time.perf_counter()  # nowhere to write: said before the first probe, no traceback
    assert main(["tune", "--out", "/proc/gmi-drl-tune-test", "--max-gmis", "1"]) == 2
    assert "cannot write the search's files in --out /proc/gmi-drl-tune-test" in (
        capsys.readouterr().err)
    assert time.perf_counter() - t0 < 10
    out = tmp_path / "tune"
    out.mkdir()
    (out / "tuned.json").write_text("{}")  # from an earlier search
    report = tune(cfg, TuneOptions(out=str(out), max_gmis=1, budget_s=1e-9))
    assert report.chosen is None and report.tuned_path is None
    assert (out / "tuned.json").read_text() == "{}"
    assert not list(out.glob("*.tmp"))
    capsys.readouterr()
    assert main(["tune", "--out", str(out), "--max-gmis", "1", "--budget-s", "1e-9"]) == 1
    assert "tuned.json is an earlier search's, left as it was" in capsys.readouterr().err


def test_tune_refuses_an_algorithm_the_task_cannot_run_before_probing(tmp_path, capsys):
    from gmi_drl.cli import main

    t0 = time.perf_counter()
    assert main(["tune", "--algo", "dqn", "--env.task-id", "Pendulum-v1", "--max-gmis", "1",
                 "--out", str(tmp_path / "out")]) == 2
    assert "Discrete" in capsys.readouterr().err
    assert time.perf_counter() - t0 < 10  # no probe ran (one takes longer)
    assert not (tmp_path / "out").exists()  # nothing written


def test_estimate_projects_to_more_devices_with_the_allreduce_term():
    from gmi_drl.tune import Tuner

    cfg = preset("auto", "CartPole-v1", "ppo")
    point = Point(2, 64, True, top=1000.0, mem=1.0,
                  terms={"t_s": 0.2, "t_a": 0.3, "t_t": 0.4, "t_comm": 0.1, "model_bytes": 1e6})
    assert Tuner(cfg, num_devices=1).estimate(2, point) == 1000.0  # one device: as measured
    # 4 devices: n = 8 GMIs move 2 * 7/8 * 1 MB = 1.75 MB at 10 MB/s = 0.175 s instead of 0.1 s
    got = Tuner(cfg, num_devices=4, bw_bytes_per_s=1e7).estimate(2, point)
    assert got == pytest.approx(1000.0 * 4 * 1.0 / (0.9 + 0.175))
    with pytest.raises(ValueError, match="bandwidth"):
        Tuner(cfg, num_devices=4).estimate(2, point)


def test_a_script_without_the_main_guard_is_told_what_to_add(tmp_path):
    """The fork server that starts the probes imports the caller's main script, as
    multiprocessing does: a script without the guard fails in every probe before it starts,
    and the reason says why instead of 'no output'."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text("from gmi_drl.config import preset, to_dict\n"
                      "from gmi_drl.tune import ProbeFailed, run_probe\n"
                      "try:\n"
                      "    run_probe(to_dict(preset('auto', 'CartPole-v1', 'ppo')), 1, 1, 60)\n"
                      "except ProbeFailed as e:\n"
                      "    print('REASON:', e)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert "REASON: exit status 1 before the probe started" in done.stdout, done.stderr[-2000:]
    assert "'if __name__ == \"__main__\":' guard" in done.stdout


def test_signals_sent_inside_a_deferred_block_arrive_when_it_ends():
    import signal

    from gmi_drl.gmi.launcher import signals_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred(signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("the block ran to its end")
    assert done == ["the block ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_or_a_hangup_to_tune_stops_its_probe_and_keeps_the_cache(tmp_path, signame):
    """The probe runs in a session of its own, so a signal to `tune` alone (``timeout``,
    systemd) or to its terminal's group never reaches it: `tune` must stop it, as on Ctrl-C."""
    import signal
    import subprocess
    import sys

    env = confined_tmp(tmp_path)
    scratch = Path(env["TMPDIR"])  # (what the processes' environment says)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "gmi_drl.cli", "tune", "--env.task-id", "CartPole-v1",
           "--max-gmis", "1", "--envs-min", "2", "--envs-max", "4", "--min-steps", "2000",
           "--probe-timeout-s", "120", "--no-compile", "--out", str(out)]
    tuner = subprocess.Popen(  # (a hangup as from a terminal: not ignored, as nohup has it)
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (out / "tune_cache.json").exists():
            time.sleep(0.2)  # the first point measured: the second probe starts now
        assert (out / "tune_cache.json").exists(), tuner.communicate(timeout=30)[0]
        time.sleep(1.0)
        pids = _processes_with(f"TMPDIR={scratch}", but=tuner.pid)
        assert pids, "no probe was running: the test proves nothing"
        tuner.send_signal(getattr(signal, signame))
        output = tuner.communicate(timeout=30)[0]
        assert tuner.returncode == 128 + getattr(signal, signame), output
        for _ in range(50):
            if not _processes_with(f"TMPDIR={scratch}"):
                break
            time.sleep(0.2)
        assert _processes_with(f"TMPDIR={scratch}") == []
        assert [n for n in os.listdir(scratch) if n.startswith(("gmi-drl-", "pymp-"))] == []
        entries = json.loads((out / "tune_cache.json").read_text())["entries"]
        assert [list(points) for points in entries.values()] == [["1,2"]]  # kept
    finally:
        if tuner.poll() is None:
            tuner.kill()
        for pid in _processes_with(f"TMPDIR={scratch}"):  # what the test found left
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_ctrl_c_while_the_first_probe_starts_leaves_no_probe_and_prints_no_traceback(
        tmp_path):
    """Ctrl-C in the seconds the fork server imports its preload (the first probe's start)
    used to leave the probe queued in the server: forked after `tune` had given it up, it
    failed on its removed directory with a traceback on the terminal."""
    import signal
    import subprocess
    import sys

    env = confined_tmp(tmp_path)
    scratch = Path(env["TMPDIR"])  # (what the processes' environment says)
    for delay in (0.5, 1.5):  # after tune printed its table's head: the first probe starting
        tuner = subprocess.Popen(
            [sys.executable, "-m", "gmi_drl.cli", "tune", "--env.task-id", "CartPole-v1",
             "--max-gmis", "1", "--envs-min", "2", "--envs-max", "4",
             "--out", str(tmp_path / "out")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            head, line = [], tuner.stdout.readline()
            while line and not line.startswith("|---|"):  # (start-up's length varies by host)
                head.append(line)
                line = tuner.stdout.readline()
            time.sleep(delay)
            os.killpg(tuner.pid, signal.SIGINT)  # as a terminal's Ctrl-C
            output = "".join(head) + line + tuner.communicate(timeout=30)[0]
            time.sleep(2.0)  # (what the server would still fork)
            assert tuner.returncode == 130 and "Traceback" not in output, output
            assert _processes_with(f"TMPDIR={scratch}") == []
        finally:
            if tuner.poll() is None:
                tuner.kill()
            for pid in _processes_with(f"TMPDIR={scratch}"):
                os.kill(pid, 9)


def _processes_with(entry: str, but: int | None = None) -> list[int]:
    """Live processes whose environment (as they were started) holds ``entry``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == but:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if entry.encode() in env and state != "Z":
            found.append(int(name))
    return found
