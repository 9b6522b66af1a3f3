"""The emulated rack (root only): worker namespaces cabled by rate-limited veth links to a switch
namespace that forwards IP and runs the daemon; the mean through it is exact, and the rack is
gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gmi_drl.comm.switch.netns import Rack, leftover_namespaces, netns_available

WHY = netns_available()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"emulated rack: {WHY}")

WORKER = """
import json, sys, torch
from gmi_drl.comm.switch import SwitchReducer
rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
red = SwitchReducer(addr, rank, world, job_id="rack", join_timeout_s=60)
t = torch.randn(50_000, generator=torch.Generator().manual_seed(rank))
red.allreduce_([t])
red.close()
print(json.dumps(t.tolist()[:2000]))
"""


@pytest.mark.distributed
def test_mean_through_the_rack_is_exact():
    prefix = f"gmit{os.getpid() % 100000}"
    py = sys.executable
    with Rack(3, rate_mbit=100, mtu=1500, prefix=prefix) as rack:
        sw = rack.popen("sw", [py, "-m", "gmi_drl.comm.switch", "serve", "--bind", "0.0.0.0:9999",
                               "--mtu", "1500", "--stats-interval", "0"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert sw.stdout.readline().startswith("listening on")
            ws = [rack.popen(f"w{r}", [py, "-c", WORKER, str(r), "3",
                                       f"{rack.worker_gateway[r]}:9999"],
                             stdout=subprocess.PIPE, text=True) for r in range(3)]
            outs = [w.communicate(timeout=120)[0] for w in ws]
            assert all(w.returncode == 0 for w in ws)
        finally:
            sw.terminate()
            final, err = sw.communicate(timeout=20)
        import torch

        g = [torch.randn(50_000, generator=torch.Generator().manual_seed(r)) for r in range(3)]
        ref = (((g[0] + g[1]) + g[2]) / 3).numpy()[:2000]
        for out in outs:
            assert np.array_equal(np.asarray(json.loads(out), np.float32), ref)
        stats = json.loads(final.strip().splitlines()[-1])
        assert stats["segments_completed"] == -(-50_000 // 366)
        assert sw.returncode == 0, err
    assert leftover_namespaces(prefix) == []


@pytest.mark.distributed
@pytest.mark.parametrize("reduction", ["switch", "ring"])
def test_gmis_train_inside_the_rack(tmp_path, reduction):
    """The launcher's netns option: GMI k joins worker namespace k before opening sockets, then
    reduces through the switch (each GMI at its own switch port) or a gloo ring across the
    links; no address of the rack is reachable from outside it, so finishing proves it."""
    from gmi_drl.config import preset
    from gmi_drl.train import train

    prefix = f"gmig{os.getpid() % 100000}"
    py = sys.executable
    with Rack(2, rate_mbit=100, mtu=1500, with_ps=False, prefix=prefix) as rack:
        cfg = preset("classic", "CartPole-v1")
        cfg.env.num_envs, cfg.algo.num_steps, cfg.compile = 4, 32, False
        cfg.gmi.num_gmis, cfg.total_timesteps = 2, 2 * 2 * 4 * 32
        cfg.gmi.reduction, cfg.gmi.netns = reduction, f"{rack.ns['w0']},{rack.ns['w1']}"
        if reduction == "switch":
            cfg.gmi.switch_addr = ",".join(f"{gw}:9999" for gw in rack.worker_gateway)
        cfg.log.tensorboard, cfg.run_dir = False, str(tmp_path / "run")
        sw = None
        if reduction == "switch":
            sw = rack.popen("sw", [py, "-m", "gmi_drl.comm.switch", "serve", "--bind",
                                   "0.0.0.0:9999", "--mtu", "1500", "--stats-interval", "0",
                                   "--log-level", "INFO"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert sw.stdout.readline().startswith("listening on")
        try:
            result = train(cfg)
        finally:
            if sw is not None:
                sw.terminate()
                final, err = sw.communicate(timeout=20)
        assert len(result.weight_digests) == 2 and len(set(result.weight_digests)) == 1
        summary = (result.run_dir / "summary.md").read_text()
        assert "Algorithm 1" not in summary  # the reduction was chosen, not Algorithm 1's
        assert f"gradient reduction: `{reduction}`" in summary
        assert ("one ring over all GMIs" in summary) == (reduction == "ring")
        if sw is not None:
            assert json.loads(final.strip().splitlines()[-1])["segments_completed"] > 0
            for ip in rack.worker_ip:
                assert f"joined from {ip}:" in err
    assert leftover_namespaces(prefix) == []
