"""Runs as GMIs over a Ray cluster (``gmi-drl train ALGO --seeds ... --placement ray``): the same
runs as on this machine, one Ray actor each, spread over the real two-node local cluster; and
the sweep's parent evaluated as serving GMIs there (``gmi-drl eval PARENT --placement ray``)."""

import json
import subprocess
import sys

import pytest

from tests.cluster.conftest import NODE_CPUS, assert_nothing_left

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "gmi_drl.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_seeds_spread_over_the_clusters_nodes_and_evaluate_there(ray_cluster, tmp_path):
    ray = ["--placement", "ray", "--ray.address", ray_cluster.address,
           "--ray.num-cpus-per-gmi", str(NODE_CPUS)]  # a node's every CPU: one run per node
    out = _cli("train", "ppo", "--env.task-id", "CartPole-v1", "--seeds", "1-2",
               "--total-timesteps", "1024", "--log.no-tensorboard", "--no-compile",
               "--run-dir", "sweep", *ray, cwd=tmp_path)  # (relative: the driver's directory)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 2 of 2 runs" in out.stdout
    parent = tmp_path / "sweep"
    for seed in (1, 2):
        run = parent / f"seed-{seed}"
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["seed"] == seed and cfg["placement"] == "local"  # (its one GMI, in its actor)
        assert list((run / "checkpoints").glob("iteration-*.pt"))
    summary = (parent / "summary.md").read_text()
    assert "placement: Ray, 2 node(s)" in summary and "| seed-2 | " in summary
    assert_nothing_left(ray_cluster)

    out = _cli("eval", "sweep", "--episodes", "2", *ray, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    table = (parent / "eval.md").read_text()
    assert "| the command | 2 |" in table and "placement: Ray, 2 node(s)" in table
    assert "template: `serving`" in table
    assert_nothing_left(ray_cluster)
