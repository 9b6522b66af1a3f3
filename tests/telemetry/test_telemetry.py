import json
import math
import time

import numpy as np
import pytest

from gmi_drl.telemetry import Timeline, TimingTree, get_tree, set_tree, timer
from gmi_drl.telemetry.progress import Progress, format_duration, format_progress
from gmi_drl.telemetry.summary import RunSummary, write_summary


def test_nested_timers_build_a_tree_and_a_timeline(tmp_path):
    tree = TimingTree(Timeline(max_detail_events=3))
    previous = set_tree(tree)
    try:
        for _ in range(2):
            with timer("rollout"):
                for _ in range(2):
                    with timer("env_step"):
                        time.sleep(0.002)
            with timer("update"):
                pass
    finally:
        set_tree(previous)
    stats = tree.stats()
    assert list(stats) == ["rollout", "rollout/env_step", "update"]
    assert stats["rollout/env_step"].calls == 4
    assert stats["rollout"].total_s >= stats["rollout/env_step"].total_s >= 0.008
    tree.timeline.write(tmp_path / "timeline.json")
    doc = json.loads((tmp_path / "timeline.json").read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # all 4 top-level events, 3 of the 4 detail events (budget), the 4th counted as dropped
    assert sum(e["cat"] == "rollout/env_step" for e in xs) == 3
    assert sum(e["cat"] in ("rollout", "update") for e in xs) == 4
    assert doc["otherData"]["dropped_detail_events"] == 1
    assert all(e["dur"] >= 0 and "ts" in e for e in xs)


def test_iterations_are_recorded_with_their_seconds_per_phase(tmp_path):
    tree = TimingTree(Timeline(max_detail_events=0, process_name="gmi-3"))
    previous = set_tree(tree)
    try:
        for k in (5, 6):
            with tree.iteration(k):
                with timer("rollout"):
                    with timer("env_step"):
                        time.sleep(0.002)
                with timer("update"):
                    pass
        with pytest.raises(RuntimeError), tree.iteration(7):
            raise RuntimeError("a failed iteration is not recorded")
    finally:
        set_tree(previous)
    tree.timeline.write(tmp_path / "timeline.json")
    doc = json.loads((tmp_path / "timeline.json").read_text())
    its = [e for e in doc["traceEvents"] if e.get("cat") == "iteration"]
    assert [e["args"]["iteration"] for e in its] == [5, 6]
    for e in its:
        phases = e["args"]["phases_s"]
        assert set(phases) == {"rollout", "rollout/env_step", "update"}  # despite 0 detail budget
        assert e["dur"] / 1e6 >= phases["rollout"] >= phases["rollout/env_step"] >= 0.002
    assert its[0]["ts"] + its[0]["dur"] <= its[1]["ts"]
    other = doc["otherData"]
    assert other["process_name"] == "gmi-3" and other["host"] and other["pid"] > 0
    assert other["clock"]["unix_us"] > 1.6e15 and other["clock"]["perf_counter_us"] > 0


def test_default_tree_is_usable_without_setup():
    with timer("x"):
        pass
    assert get_tree().calls["x"] >= 1


def test_progress_line_and_durations():
    line = format_progress(Progress(500, 1000, 100.0, 12.34, 5.0))
    assert "500/1,000" in line and "100 sps" in line and "12.3" in line and "ETA 5s" in line
    assert format_duration(3725) == "1h02m" and format_duration(math.inf) == "?"
    assert "n/a" in format_progress(Progress(0, 10, 0.0, math.nan, 0.0))


def test_summary_has_returns_and_phase_table(tmp_path):
    tree = TimingTree()
    set_tree(tree)
    with timer("update"):
        pass
    s = RunSummary("PPO on X", 100, 2.0, 100, np.array([50, 100]), np.array([1.0, 3.0]),
                   tree.stats())
    text = write_summary(s, tmp_path).read_text()
    assert "final return (mean of last 20 episodes): 2.00" in text
    assert "| update |" in text and "50 env steps/s" in text
    rest = 2.0 - tree.stats()["update"].total_s  # the wall time no phase took
    assert f"| *outside these phases* (loop, waits, a profiler's own work) | {rest:.2f} | " \
           f"{50 * rest:.1f} |" in text
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    assert "last training loop alone" not in text and "after the first iteration" not in text
    text = write_summary(s._replace(steady_sps=80.0), tmp_path).read_text()
    assert "50 env steps/s (perf/sps); 80 after the first iteration, which pays" in text
    resumed = s._replace(steps_this_process=40)  # a loop that began at global_step 60
    text = write_summary(resumed, tmp_path).read_text()
    assert "20 env steps/s" in text and ("those of the last training loop alone, from "
                                         "global_step 60 (a resume") in text
    set_tree(TimingTree())


def test_a_resumed_writer_drops_the_rows_after_its_checkpoint(tmp_path):
    import csv

    from gmi_drl.telemetry.metrics import MetricsWriter

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = MetricsWriter(tmp_path)
    for step in (100, 200, 300):
        w.log(step, {"loss": step / 100})
    w.close()
    w = MetricsWriter(tmp_path, purge_step=200)  # crashed after 300, saved at 200
    w.log(300, {"loss": 9.0})
    w.close()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [(r["global_step"], r["value"]) for r in rows] == [("100", "1"), ("200", "2"),
                                                                ("300", "9")]
    events = EventAccumulator(str(tmp_path))
    events.Reload()  # TensorBoard's curve is the CSV's: the checkpoint's own step kept
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(100, 1.0), (200, 2.0),
                                                                  (300, 9.0)]


def test_a_resumed_writer_repairs_what_a_killed_writer_left(tmp_path):
    """A GMI process killed before its buffer reached the disk leaves metrics.csv empty, or
    rows without the header, or half a row: a resumed run's file still reads as a table."""
    import csv

    from gmi_drl.telemetry.metrics import MetricsWriter

    path = tmp_path / "metrics.csv"
    path.write_text("")
    w = MetricsWriter(tmp_path, tensorboard=False, purge_step=0)
    w.log(100, {"loss": 1.0})
    w.close()
    assert list(csv.DictReader(open(path)))[0]["global_step"] == "100"
    path.write_text("100,0.5,loss,1\n200,0.9,loss,2\n300,1.2,lo")  # no header, a cut row
    w = MetricsWriter(tmp_path, tensorboard=False, purge_step=200)
    w.log(300, {"loss": 3.0})
    w.close()
    rows = list(csv.DictReader(open(path)))
    assert [(r["global_step"], r["value"]) for r in rows] == [("100", "1"), ("200", "2"),
                                                                ("300", "3")]


def test_metric_rows_reach_the_file_as_they_are_logged(tmp_path):
    """A live run's metrics.csv can be followed (tail, a plot) between checkpoints."""
    import csv

    from gmi_drl.telemetry.metrics import MetricsWriter

    w = MetricsWriter(tmp_path, tensorboard=False)
    try:
        for step in (100, 200):
            w.log(step, {"loss": step / 100})
            rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
            assert rows[-1]["global_step"] == str(step)
    finally:
        w.close()
