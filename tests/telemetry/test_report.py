"""`gmi-drl profile report`: timeline merge, phase breakdown, GPU utilisation, and a real run."""

import csv
import json

import pytest

from gmi_drl.cli import main
from gmi_drl.config import preset
from gmi_drl.telemetry.report import (GPU_PID, iteration_breakdown, load_timelines,
                                      merge_timelines, write_report)


def _timeline(path, name, host_pid, perf_us, unix_us, events):
    """A timeline.json as `Timeline.write` makes it, from ``(name, cat, ts, dur, args)`` rows."""
    pid, tid = host_pid, host_pid
    trace = [{"name": "process_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}]
    for ev_name, cat, ts, dur, args in events:
        e = {"name": ev_name, "cat": cat, "ph": "X", "pid": pid,
             "tid": 0 if cat == "iteration" else tid, "ts": ts, "dur": dur}
        if args is not None:
            e["args"] = args
        trace.append(e)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": trace, "otherData": {
        "host": "h", "pid": pid, "clock": {"perf_counter_us": perf_us, "unix_us": unix_us}}}))


def _two_gmis(run):
    # GMI 0's perf_counter is 1,000,000 us behind Unix time minus 5e6; GMI 1's is on another
    # host whose perf_counter reads 9,000,000 us more at the same Unix time
    it0 = {"iteration": 0, "phases_s": {"rollout": 0.006, "rollout/env_step": 0.004,
                                        "advantages": 0.001, "update": 0.002,
                                        "update/allreduce": 0.0005, "update/optimizer": 0.00025,
                                        "log": 0.0005}}
    _timeline(run / "timeline.json", "gmi-0", 11, 1_000.0, 5_001_000.0, [
        ("rollout", "rollout", 100.0, 6000.0, None),
        ("iteration 0", "iteration", 100.0, 10_000.0, it0)])
    _timeline(run / "gmi-1" / "timeline.json", "gmi-1", 22, 10_000.0, 5_001_000.0, [
        ("rollout", "rollout", 9_200.0, 5000.0, None)])


def test_merge_aligns_clocks_names_one_track_per_gmi_and_adds_gpu_counters(tmp_path):
    run = tmp_path / "run"
    _two_gmis(run)
    gpu = run / "gpu_util.csv"
    gpu.write_text("unix_s,gpu,util_pct,mem_util_pct,mem_used_mib\n5.0001,0,37,5,100.0\n")
    timelines = load_timelines(run)
    assert [t.gmi_id for t in timelines] == [0, 1]
    doc = merge_timelines(timelines, gpu)
    xs = {(e["pid"], e["cat"]): e for e in doc["traceEvents"] if e["ph"] == "X"}
    # Unix start of GMI 0's rollout: 100 + 5_000_000 = 5_000_100; of GMI 1's: 9_200 + 4_991_000
    # = 5_000_200, so GMI 1's starts 100 us later; the earliest event is time 0
    assert xs[(0, "rollout")]["ts"] == 0.0 and xs[(1, "rollout")]["ts"] == 100.0
    assert xs[(0, "iteration")]["args"]["iteration"] == 0
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "gmi-0 (h pid 11)", 1: "gmi-1 (h pid 22)", GPU_PID: "GPUs (NVML)"}
    (counter,) = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert counter["ts"] == 0.0 and counter["args"] == {"util_pct": 37.0, "mem_util_pct": 5.0}
    assert doc["otherData"]["t0_unix_us"] == 5_000_100.0


def test_breakdown_splits_each_iteration_into_the_iswitch_categories(tmp_path):
    run = tmp_path / "run"
    _two_gmis(run)
    (row,) = iteration_breakdown(load_timelines(run))
    assert (row.gmi_id, row.iteration, row.wall_s) == (0, 0, 0.01)
    assert row.aggregation_s == pytest.approx(0.0005)
    assert row.weight_update_s == pytest.approx(0.00025)
    # (rollout + advantages + update) - allreduce - optimizer
    assert row.computation_s == pytest.approx(0.009 - 0.00075)
    assert row.other_s == pytest.approx(0.01 - 0.009)  # log and gaps


def test_report_files_and_clear_errors(tmp_path, capsys):
    run = tmp_path / "run"
    _two_gmis(run)
    files = write_report(run)
    md = files.markdown.read_text()
    assert "| gmi-0 | 1 | 10.00 | 82.5 | 5.0 | 2.5 | 10.0 |" in md
    assert "NVML saw no GPU" in md and files.gpu_plot is None
    assert files.breakdown_plot.stat().st_size > 5000
    with open(files.breakdown_csv) as f:
        (r,) = list(csv.DictReader(f))
    assert (r["gmi"], r["wall_ms"], r["aggregation_ms"], r["rollout/env_step_ms"]) == (
        "0", "10.0", "0.5", "4.0")
    assert main(["profile", "report", str(tmp_path / "nope")]) == 2
    assert "has no timeline.json" in capsys.readouterr().err
    (run / "timeline.json").write_text("{not json")
    assert main(["profile", "report", str(run)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


@pytest.mark.distributed
def test_a_profiled_two_gmi_run_reports_every_phase_of_every_gmi(tmp_path):
    cfg = preset("classic", "CartPole-v1")
    cfg.env.num_envs, cfg.algo.num_steps, cfg.total_timesteps = 2, 32, 2 * 2 * 32 * 3
    cfg.gmi.num_gmis, cfg.run_dir, cfg.log.tensorboard = 2, str(tmp_path / "run"), False
    cfg.compile = False  # the eager step's forward / backward / optimizer sections
    cfg.profile.tool, cfg.profile.ranks, cfg.profile.iterations = "torch", [1], [1]
    from gmi_drl.train import train

    train(cfg)
    run = tmp_path / "run"
    doc = json.loads((run / "profile" / "trace.json").read_text())
    cats = {(e["pid"], e.get("cat")) for e in doc["traceEvents"] if e["ph"] == "X"}
    for gmi in (0, 1):
        for phase in ("rollout", "rollout/env_step", "rollout/inference", "advantages",
                      "update", "update/forward", "update/backward", "update/allreduce",
                      "update/optimizer", "log", "iteration"):
            assert (gmi, phase) in cats, (gmi, phase)
    rows = iteration_breakdown(load_timelines(run))
    assert sorted((r.gmi_id, r.iteration) for r in rows) == [(g, k) for g in (0, 1)
                                                             for k in range(3)]
    assert all(r.aggregation_s > 0 and r.computation_s > 0 for r in rows)
    # only GMI 1 was profiled, at iteration 1; every top-level phase belongs to roles
    assert sorted(p.name for p in (run / "profile").glob("gmi-*/*")) == [
        "captures.json", "torch-iteration-1.json"]
    assert (run / "profile" / "gmi-1" / "torch-iteration-1.json").exists()
    tops = {r.rsplit("/")[0] for row in rows for r in row.phases_s}
    assert tops <= {"rollout", "advantages", "update", "log", "checkpoint"}
    assert "| gmi-1 | 3 |" in (run / "profile" / "report.md").read_text()


def test_an_async_runs_iterations_split_into_the_same_categories(tmp_path):
    """An APPO trainer's ``learn`` is its update: computation, with aggregation and the
    weight update inside it; waiting for a batch is other."""
    cfg = preset("classic", "CartPole-v1", algo="appo")
    cfg.total_timesteps, cfg.placement, cfg.compile = 4096, "serial", False
    cfg.run_dir, cfg.log.tensorboard = str(tmp_path / "run"), False
    from gmi_drl.train import train

    train(cfg)
    write_report(tmp_path / "run")
    rows = iteration_breakdown(load_timelines(tmp_path / "run"))
    assert rows and all(r.computation_s > 0 and r.weight_update_s > 0 for r in rows)
    for r in rows:
        ph = r.phases_s
        assert r.aggregation_s == ph["learn/allreduce"] and r.weight_update_s == \
            ph["learn/optimizer"]
        # forward and backward are computation; waiting for a batch and publishing are other
        assert r.computation_s >= ph["learn/forward"] + ph["learn/backward"]
        assert r.other_s >= ph["batch"] + ph["publish"] - 1e-9
        assert r.computation_s + r.aggregation_s + r.weight_update_s + r.other_s == \
            pytest.approx(r.wall_s)
    with open(tmp_path / "run" / "profile" / "phase_breakdown.csv") as f:
        header = next(csv.reader(f))
    assert {"batch_ms", "learn_ms", "learn/optimizer_ms"} <= set(header)
    assert "rollout_ms" not in header  # a sync phase this run does not have
