"""Runs as GMIs (`gmi_drl.sweep`, ``gmi-drl train ALGO --seeds ... --sweep ...``): every run of
a grid and its seeds in its own run directory, a run that fails reported while the others go
on, the aggregate over seeds, refusals before any run starts (a flag value, a budget), and the
sweep's parent evaluated as serving GMIs (`gmi_drl.serving`, ``gmi-drl eval PARENT``)."""

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from gmi_drl.config import ConfigError
from gmi_drl.sweep import aggregate, grid_points, parse_seeds, parse_sweep

FAST = ["--total-timesteps", "2048", "--log.no-tensorboard", "--no-compile"]


def _cli(*args, cwd, command="train"):
    return subprocess.run([sys.executable, "-m", "gmi_drl.cli", command, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240)


@pytest.fixture
def refused(capsys, monkeypatch, tmp_path):
    """``refused(*args)``: ``gmi-drl train *args`` run in this process from ``tmp_path``, for
    a command refused before any run starts (no interpreter and torch import of its own, as a
    subprocess would cost); its exit status and stderr."""
    from gmi_drl.cli import main

    monkeypatch.chdir(tmp_path)

    def run(*args):
        capsys.readouterr()
        status = main(["train", *args])
        return status, capsys.readouterr().err

    return run


def test_seeds_and_grids_parse_and_refuse_what_is_not_one():
    assert parse_seeds("1-3,7,2") == [1, 2, 3, 7]
    assert parse_seeds("5") == [5]
    for bad in ("3-1", "a", "-2", ""):
        with pytest.raises(ConfigError, match="give seeds as"):
            parse_seeds(bad)
    grid = parse_sweep(["algo.learning-rate=1e-4,3e-4", "--algo.gamma=0.9"])
    assert grid == [("algo.learning-rate", ["1e-4", "3e-4"]), ("algo.gamma", ["0.9"])]
    assert grid_points(grid) == [
        ("algo.learning-rate=1e-4,algo.gamma=0.9", ["--algo.learning-rate", "1e-4",
                                                     "--algo.gamma", "0.9"]),
        ("algo.learning-rate=3e-4,algo.gamma=0.9", ["--algo.learning-rate", "3e-4",
                                                     "--algo.gamma", "0.9"])]
    assert grid_points([]) == [("", [])]
    with pytest.raises(ConfigError, match="give FLAG=V1,V2"):
        parse_sweep(["algo.learning-rate"])
    for flag, why in (("seed", "the seeds are --seeds"), ("--run-dir", "each run's directory "
                      "is PARENT/POINT/seed-K"), ("run_dir", "each run's directory"),
                      ("resume", "a batch starts fresh runs")):
        with pytest.raises(ConfigError, match=f"--sweep {flag.removeprefix('--')}: {why}"):
            parse_sweep([f"{flag}=1,2"])
    with pytest.raises(ConfigError, match="names algo.gamma twice"):
        parse_sweep(["algo.gamma=0.9", "algo.gamma=0.99"])


def test_the_aggregate_is_the_iqm_with_a_bootstrap_interval():
    a = aggregate([1.0, 2.0, 3.0, 4.0, 100.0, float("nan")])  # (nan: a run without episodes)
    assert a["mean"] == pytest.approx(22.0) and a["iqm"] == pytest.approx(3.0)
    assert a["low"] <= a["iqm"] <= a["high"] and a["high"] < 100.0
    one = aggregate([5.0])
    assert one["iqm"] == 5.0 and np.isnan(one["low"])


@pytest.mark.slow
def test_a_grid_of_seeds_runs_as_gmis_each_in_its_own_run_dir(tmp_path, capsys):
    parent = tmp_path / "sweep"
    out = _cli("ppo", "--seeds", "1-2", "--sweep", "algo.learning-rate=1e-3,3e-4", *FAST,
               "--run-dir", str(parent), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "done: 4 of 4 runs" in out.stdout
    for lr in ("1e-3", "3e-4"):
        for seed in (1, 2):
            run = parent / f"algo.learning-rate={lr}" / f"seed-{seed}"
            cfg = json.loads((run / "config.json").read_text())
            assert cfg["seed"] == seed and cfg["algo"]["ppo"]["learning_rate"] == float(lr)
            assert list((run / "checkpoints").glob("iteration-*.pt"))
    summary = (parent / "summary.md").read_text()
    assert "| algo.learning-rate=1e-3 | 2 |" in summary and "| algo.learning-rate=3e-4 | 2 |" \
        in summary
    assert summary.count("| algo.learning-rate=") == 2 + 4  # the aggregates, then every run
    assert "one GMI per run" in summary and "- budget on the CPU: GMI 0: cores [" in summary
    assert (parent / "learning_curves.png").stat().st_size > 0
    _the_parent_evaluates_as_serving_gmis(parent, tmp_path, capsys)
    _one_run_of_the_parent_resumes_alone(parent)


def _one_run_of_the_parent_resumes_alone(parent):
    """``gmi-drl train ALGO --resume PARENT/RUN`` (docs/usage.md): that run goes on from its
    checkpoint with its own seed and grid value; the other runs are untouched."""
    from gmi_drl.cli import main

    run, other = parent / "algo.learning-rate=1e-3" / "seed-2", parent / "algo.learning-rate=3e-4"
    before = sorted((other / "seed-1" / "checkpoints").iterdir())
    assert main(["train", "ppo", "--resume", str(run), "--total-timesteps", "4096"]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["seed"] == 2 and cfg["algo"]["ppo"]["learning_rate"] == 1e-3
    assert cfg["total_timesteps"] == 4096
    steps = [int(r["global_step"]) for r in csv.DictReader(open(run / "metrics.csv"))]
    assert max(steps) == 4096 and min(steps) <= 2048  # the first run's rows, then the resumed
    assert sorted((other / "seed-1" / "checkpoints").iterdir()) == before


def _the_parent_evaluates_as_serving_gmis(parent, tmp_path, capsys):
    """``gmi-drl eval PARENT``: every run's checkpoint in a serving GMI, the same returns as
    ``gmi-drl eval RUN`` alone, one table on stdout and in PARENT/eval.md; what a parent cannot
    take (a video, a bad count or seed, a budget its GMIs cannot have) refused before any GMI
    starts; a run whose checkpoint does not load is reported and the others are evaluated."""
    from gmi_drl.cli import main
    from gmi_drl.evaluate import evaluate

    out = _cli(str(parent), "--episodes", "2", cwd=tmp_path, command="eval")
    assert out.returncode == 0, out.stderr
    table = (parent / "eval.md").read_text()
    assert table in out.stdout and "4 runs of" in out.stdout
    assert "| algo.learning-rate=1e-3 | 2 |" in table and "| algo.learning-rate=3e-4 | 2 |" in table
    assert "template: `serving` (roles simulator, agent)" in table
    alone = evaluate(parent / "algo.learning-rate=3e-4" / "seed-2", episodes=2).returns
    assert f"| algo.learning-rate=3e-4/seed-2 | {alone.mean():.1f} | {alone.std():.1f} | 2 |" \
        in table
    capsys.readouterr()  # a run directory: as before (in this process: no GMI to start)
    run = parent / "algo.learning-rate=3e-4" / "seed-2"
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert f"return {alone.mean():.2f} +/- " in capsys.readouterr().out
    for flags, why in ((["--video"], "--video records one run's episode: give that run's "
                        "directory"),
                       (["--episodes", "0"], "--episodes 0 and --num-envs 4 must be >= 1"),
                       (["--seed", "-1"], r"--seed -1 in \[0, 2\*\*31\)"),
                       (["--budget.threads-pct", "50"], "are MPS budgets of GMIs on a GPU; these GMIs are CPU "
                        "core sets"),
                       (["--budget.cores", str(os.cpu_count() + 1)], "budget does not fit the "
                        "CPU")):
        capsys.readouterr()
        assert main(["eval", str(parent), *flags]) == 2, flags  # (nothing evaluated)
        assert re.search(f"gmi-drl eval: .*{why}", capsys.readouterr().err), flags
    (parent / "broken" / "seed-1" / "checkpoints").mkdir(parents=True)
    out = _cli(str(parent), "--episodes", "2", cwd=tmp_path, command="eval")
    assert out.returncode == 1
    assert "run broken/seed-1 not evaluated: " in out.stderr
    assert (parent / "eval.md").read_text().count("| algo.learning-rate=") == 2 + 4


def test_a_run_that_fails_is_reported_while_the_others_finish(tmp_path):
    parent = tmp_path / "runs"
    out = _cli("ppo", "--seeds", "1", "--sweep", "algo.learning-rate=1e-3,1e30", *FAST,
               "--run-dir", str(parent), cwd=tmp_path)  # 1e30: weights NaN after one update
    assert out.returncode == 1
    assert "run algo.learning-rate=1e30/seed-1 stopped: TrainingDiverged" in out.stderr
    assert "done: 1 of 2 runs" in out.stdout
    summary = (parent / "summary.md").read_text()
    assert "| algo.learning-rate=1e30/seed-1 | failed: TrainingDiverged" in summary
    assert list((parent / "algo.learning-rate=1e-3" / "seed-1" / "checkpoints").glob(
        "iteration-*.pt"))


def test_bad_input_is_refused_before_any_run_starts(tmp_path, refused):
    status, err = refused("ppo", "--seeds", "1", "--sweep", "algo.learning-rate=1e-3,-1", *FAST,
                          "--run-dir", str(tmp_path / "a"))
    assert status == 2
    assert "run algo.learning-rate=-1/seed-1: invalid config" in err
    assert "algo.learning_rate=-1.0 must be > 0" in err
    status, err = refused("appo", "--seeds", "1-2", "--run-dir", str(tmp_path / "b"))
    assert status == 2 and "runs each run as one GMI" in err
    # what only the task tells, found for every grid point before the first run starts
    status, err = refused("sac", "--seeds", "1", "--sweep", "env.task-id=Pendulum-v1,CartPole-v1",
                          *FAST, "--run-dir", str(tmp_path / "e"))
    assert status == 2
    assert "run env.task-id=CartPole-v1/seed-1: " in err
    assert "SAC needs a Box action space" in err
    status, err = refused("ppo", "--seeds", "1-2", "--resume", str(tmp_path / "a"))
    assert status == 2
    assert "resume one run of a batch alone, gmi-drl train ppo --resume PARENT/RUN" in err
    for d in "abe":
        assert not (tmp_path / d).exists()


def test_replays_that_fit_alone_but_not_together_are_refused_before_any_run_starts(tmp_path,
                                                                                    refused):
    """Two TD3 runs whose replays each take 0.6 of this machine's RAM (one run would be
    accepted: `check_replay_memory`), refused together, naming the sum."""
    from gmi_drl import envs
    from gmi_drl.rollout.replay import replay_nbytes

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    per = replay_nbytes(1_000_000, envs.task_spec("Pendulum-v1"), 1) / 1_000_000
    size = int(0.6 * ram / per)
    status, err = refused("td3", "--seeds", "1-2", "--env.task-id", "Pendulum-v1",
                          "--env.num-envs", "1", "--algo.buffer-size", str(size),
                          "--algo.learning-starts", "256", *FAST, "--run-dir", str(tmp_path / "r"))
    assert status == 2, err
    assert "the replay buffers of the 2 runs on this machine's RAM take" in err
    assert "GiB per run: seed-1 " in err and "lower --algo.buffer-size" in err
    assert not (tmp_path / "r").exists()


def test_a_budget_or_placement_runs_cannot_have_is_refused_before_any_run_starts(tmp_path,
                                                                                  refused):
    cores = len(os.sched_getaffinity(0))  # two runs of every core each: more than there are
    status, err = refused("ppo", "--seeds", "1-2", "--budget.cores", str(cores), *FAST,
                          "--run-dir", str(tmp_path / "c"))
    assert status == 2
    assert f"budget does not fit the CPU: 2 GMIs x {cores} cores = {2 * cores} cores" in err
    status, err = refused("ppo", "--seeds", "1", "--placement", "serial", *FAST,
                          "--run-dir", str(tmp_path / "d"))
    assert status == 2 and "run seed-1: --seeds places its runs" in err
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()
