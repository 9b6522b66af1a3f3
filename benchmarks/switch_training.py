"""PPO on Hopper-v5 with 4 GMIs in an emulated rack: gradients through the iSwitch switch against
a gloo ring allreduce, at equal steps and seeds (the paper's PPO/Hopper setting, §5.1, §6).

The rack (root; `gmi_drl.comm.switch.netns.Rack`): worker namespaces ``w0..w3``, each with its
own veth link to the switch namespace ``sw``, both directions of every link shaped by ``tc
tbf`` (``--rate-mbit``, MTU ``--mtu``). GMI ``k`` runs in ``wk`` (the launcher's ``netns``
option: it joins the namespace before it opens a socket), the switch daemon in ``sw``; the
ring's TCP traffic crosses the same links, forwarded by ``sw``'s IP stack. Methods:

- ``switch``: synchronous, `SwitchReducer.allreduce_` per minibatch;
- ``stale-sync``: the switch with staleness bound ``--staleness`` (iSwitch §4.1);
- ``ring``: one gloo ring over the 4 GMIs (``--gmi.reduction ring``).

Every method trains the same config and seed: the mujoco preset (CleanRL's
``ppo_continuous_action.py``) with ``--envs`` envs per GMI and ``--num-steps`` steps per env per
rollout, for ``--steps`` env steps over all GMIs. Writes ``<out>/curves.csv`` (per update:
method, global_step, GMI 0's mean episodic return of the episodes that ended in it),
``<out>/curves.png``, each run's directory, and prints the table: GMI 0's mean return over its
last 20 episodes, env steps/s over the loop, and the share of the loop the trainer waited for
aggregation (``perf/update/allreduce``: the collective, or, stale-sync, the time blocked by
the staleness bound and the final drain of each update).

    sudo .venv/bin/python benchmarks/switch_training.py --out runs/switch-hopper
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from pathlib import Path

SWITCH_PORT = 9999


def run_method(rack, method: str, a, out: Path) -> dict:
    from gmi_drl.config import preset
    from gmi_drl.train import train

    cfg = preset("mujoco", "Hopper-v5")
    cfg.env.num_envs, cfg.algo.num_steps = a.envs, a.num_steps
    cfg.total_timesteps, cfg.seed = a.steps, a.seed
    cfg.gmi.num_gmis = a.workers
    cfg.gmi.netns = ",".join(rack.ns[f"w{i}"] for i in range(a.workers))
    cfg.gmi.reduction = "ring" if method == "ring" else "switch"
    cfg.gmi.switch_addr = ",".join(f"{gw}:{SWITCH_PORT}" for gw in rack.worker_gateway)
    cfg.gmi.staleness = a.staleness if method == "stale-sync" else 0
    cfg.log.tensorboard, cfg.checkpoint.every = False, 0
    cfg.run_dir = str(out / method)
    daemon = None
    if method != "ring":
        daemon = rack.popen("sw", [sys.executable, "-m", "gmi_drl.comm.switch", "serve", "--bind",
                                   f"0.0.0.0:{SWITCH_PORT}", "--mtu", str(a.mtu),
                                   "--stats-interval", "0", "--member-timeout", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert daemon.stdout.readline().startswith("listening on")
    load = os.getloadavg()[0]
    try:
        result = train(cfg)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.communicate(timeout=20)
    rows = list(csv.DictReader(open(Path(cfg.run_dir) / "metrics.csv")))
    curve = [(int(r["global_step"]), float(r["value"])) for r in rows
             if r["name"] == "env/episodic_return"]
    waited = sum(float(r["value"]) for r in rows if r["name"] == "perf/update/allreduce_s")
    return {"curve": curve, "final": float(result.episode_returns[-20:].mean()),
            "sps": result.global_step / result.wall_s, "share": waited / result.wall_s,
            "wall": result.wall_s, "identical": len(set(result.weight_digests)) == 1,
            "load": (load, os.getloadavg()[0])}


def plot(results: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, r in results.items():
        steps, ret = zip(*r["curve"])
        ax.plot(steps, ret, label=method)
    ax.set_xlabel("global_step (env steps, all GMIs)")
    ax.set_ylabel("episodic return (GMI 0)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/switch-hopper")
    p.add_argument("--methods", nargs="+", default=["switch", "ring", "stale-sync"],
                   choices=["switch", "ring", "stale-sync"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--envs", type=int, default=4, help="envs per GMI")
    p.add_argument("--num-steps", type=int, default=512, help="steps per env per rollout")
    p.add_argument("--steps", type=int, default=245_760, help="env steps over all GMIs")
    p.add_argument("--staleness", type=int, default=2, help="S of the stale-sync method")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rate-mbit", type=float, default=100.0)
    p.add_argument("--mtu", type=int, default=9000)
    a = p.parse_args(argv)

    from gmi_drl.comm.switch.netns import Rack, netns_available

    why = netns_available()
    if why:
        sys.exit(f"benchmarks/switch_training.py {why}")
    out = Path(a.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    results = {}
    with Rack(a.workers, None, a.rate_mbit, a.mtu, with_ps=False) as rack:
        for method in a.methods:
            print(f"training {method} ...", flush=True)
            results[method] = run_method(rack, method, a, out)
    with open(out / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "global_step", "episodic_return"])
        for method, r in results.items():
            w.writerows((method, s, v) for s, v in r["curve"])
    batch = a.workers * a.envs * a.num_steps
    title = (f"PPO Hopper-v5, {a.workers} GMIs x {a.envs} envs, batch {batch}, seed {a.seed}, "
             f"links {a.rate_mbit:g} Mbit/s tbf, MTU {a.mtu}")
    plot(results, out, title)
    print(f"\n{title}; {a.steps} steps; one seed")
    print(f"{'method':>14} | {'final return':>12} | {'steps/s':>8} | {'wall s':>7} | "
          f"{'agg. share':>10} | identical weights | load avg (start, end)")
    names = {"switch": "switch (sync)", "ring": "gloo ring", "stale-sync": f"switch S={a.staleness}"}
    for method, r in results.items():
        print(f"{names[method]:>14} | {r['final']:12.1f} | {r['sps']:8.0f} | {r['wall']:7.1f} | "
              f"{r['share']:9.1%} | {'yes' if r['identical'] else 'NO':>17} | "
              f"{r['load'][0]:.2f}, {r['load'][1]:.2f}")
    print(f"\nwrote {out / 'curves.csv'}, {out / 'curves.png'}")


if __name__ == "__main__":
    main()
