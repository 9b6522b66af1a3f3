"""iSwitch Fig. 12 / Table 3 in an emulated rack: the four workloads (DQN Pong, A2C Qbert, PPO
Hopper, DDPG HalfCheetah; the iSwitch paper §5.1) trained by 4 GMIs whose
gradients go through the aggregation switch (synchronous and stale-sync), a parameter server
(synchronous and asynchronous) and a gloo ring, at equal steps and seeds; iSwitch Table 5 (Async PS
against asynchronous iSwitch, S = 3) once the switch aggregates asynchronously.

The rack (root; `gmi_drl.comm.switch.netns.Rack`): worker namespaces ``w0..w3``, each with its
own veth link to the switch namespace ``sw``, and a parameter-server namespace ``ps`` on the same
switch; both directions of every link shaped by ``tc tbf`` (``--rate-mbit``, MTU ``--mtu``).
GMI ``k`` runs in ``wk`` (the launcher's ``netns`` option), the switch daemon in ``sw``, the
parameter server (`gmi_drl.comm.ps`) in ``ps``; the ring's TCP traffic crosses the same links.
Methods:

- ``switch``: synchronous, `SwitchReducer.allreduce_` per gradient step;
- ``S=1``, ``S=2``: the switch with staleness bound S (iSwitch §4.1, stale-sync);
- ``ps``: `PSReducer` (every gradient to the server and the mean back, over its one link);
- ``ring``: one gloo ring over the 4 GMIs (``--gmi.reduction ring``);
- ``async-ps``: iSwitch's Async PS baseline (§2.2 Fig. 3, §6.2): each GMI's update applied by
  the server as it arrives unless more than ``--async-staleness`` (S, the paper's 3) versions
  stale (``--gmi.reduction ps --gmi.staleness S``, `gmi_drl.comm.ps.AsyncPSClient`);
- ``async-switch``: asynchronous iSwitch (§4.1, Fig. 11): the switch broadcasts each aggregate
  once ``--threshold`` H gradients of any GMIs arrived (default: the number of workers; a fast
  GMI may give several of them) and drops gradients more than ``--async-staleness`` S versions
  old (``--gmi.reduction switch --gmi.threshold H --gmi.staleness S``,
  `gmi_drl.comm.switch.threshold`).

Workloads (each GMI's share of the run; the presets' models, whose sizes match the paper's):

| workload | preset | per GMI | model |
|---|---|---|---|
| dqn-pong | dqn iswitch (Pong-v5) | 1 env, learning starts at 200 steps | 6.44 MiB |
| a2c-qbert | a2c iswitch (Qbert-v5) | 16 envs x 5 steps | 3.37 MiB |
| ppo-hopper | ppo mujoco (Hopper-v5) | 4 envs x 512 steps | 40.5 kB |
| ddpg-halfcheetah | ddpg iswitch (HalfCheetah-v5) | 1 env, learning starts at 256 steps (the DDPG figures of docs/benchmarks.md up to 2026-12-07 were measured with 100) | 157.2 kB |

Per method it prints the time per training iteration (median over the iterations after the
first one with a gradient step: env steps, acting, the gradient steps and their aggregation),
the time GMI 0 waited for aggregation per iteration (median of ``perf/update/allreduce_s``: the
collectives, or, stale-sync, the waits for the staleness bound and the drain; Async PS: the
pushes and pulls), the end-to-end time of the training loop over the whole budget (the warm-up
and a fixed number of training iterations; gradient steps run eager, as a one-time compile
would swamp short budgets), the share of the loop spent waiting for aggregation, GMI 0's mean
return of its last 20 episodes and whether all GMIs ended with identical weights (Async PS:
not expected mid-run, n/a); then each method's speed-up over ``ps``. A second table gives the
iSwitch paper's metrics (§5.1, Table 5): the training iterations and the loop's wall time until
the mean return of GMI 0's last 10 episodes first reaches the workload's common target, the
lowest final average (mean of the last 10 episodes) over the methods run, so every method
reaches it; the breakdown of an iteration (medians of GMI 0's timer sections): computation
(rollout, advantages, forward and backward), aggregation (``allreduce``) and weight update
(``optimizer``; stale-sync applies its updates on the pipeline's thread, outside this
breakdown); and for Async PS the updates the server applied and dropped.

Scalability (iSwitch §5.3, Fig. 15): ``--workers`` takes several counts, one rack each: one
switch up to 4 workers; beyond, ``--per-tor`` (3, the paper's) workers per ToR namespace under a
core namespace that also holds the parameter-server host. The switch methods then run a core
daemon and one ToR daemon per rack started with ``--parent`` (the core's address on the ToR's
link), each GMI addressing its own ToR. A count of 1 trains the same workload with one GMI and no
reduction (``--gmi.num-gmis 1``, this process), once per workload, as the denominator of every
method. The scalability table gives per workload, method and worker count the seconds per
iteration (median, as above), the aggregate env steps per second of the training loop (every
GMI's steps after the warm-up over the loop's seconds after it) and the speed-up: that over the
1-worker env steps per second (ideal: the worker count). This is a throughput speed-up measured
by a real run of every worker on this one host (the CPUs shared by all of them); the paper's
Fig. 15 is a simulated end-to-end speed-up (time to the reward). A method that fails at a count
(async-switch in a tree, while threshold mode needs a root switch) shows ``failed: <reason>`` in
its cell and the others go on.

    sudo .venv/bin/python benchmarks/switch_training.py --workloads dqn-pong ppo-hopper
    sudo .venv/bin/python benchmarks/switch_training.py --workloads ddpg-halfcheetah ppo-hopper \
        --methods ps ring switch async-ps async-switch --workers 1 4 6 9 12
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SWITCH_PORT, PS_PORT = 9999, 9998
METHODS = ("switch", "S=1", "S=2", "ps", "ring", "async-ps", "async-switch")
WINDOW = 10
"""episodes in the average the reward target compares (the paper's final average reward)"""
COMPUTATION = ("perf/rollout_s", "perf/advantages_s", "perf/update/forward_s",
               "perf/update/backward_s", "perf/update/compiled_grad_s")
"""GMI 0's timer sections (per iteration) that count as computation"""


def workload_config(name: str, workers: int, a):
    """The `TrainConfig` of workload ``name`` for ``workers`` GMIs, before the rack's
    settings; and the training iterations before the first one with a gradient step."""
    from gmi_drl.config import preset

    if name == "ppo-hopper":
        cfg = preset("mujoco", "Hopper-v5")
        cfg.env.num_envs, cfg.algo.num_steps = 4, 512
        warmup = 0
    elif name == "ddpg-halfcheetah":
        cfg = preset("iswitch", algo="ddpg")
        cfg.algo.learning_starts = warmup = 256  # (at least one minibatch)
    elif name == "dqn-pong":
        cfg = preset("iswitch", algo="dqn")
        cfg.algo.learning_starts = warmup = 200
    else:
        cfg = preset("iswitch", algo="a2c")
        warmup = 0
    cfg.gmi.num_gmis = workers
    per_iteration = cfg.batch_size  # env steps of one iteration over all GMIs
    warmup_iterations = -(-warmup * workers // per_iteration)
    cfg.total_timesteps = (warmup_iterations + a.iterations[name]) * per_iteration
    cfg.seed = a.seed
    cfg.log.tensorboard, cfg.log.log_every, cfg.checkpoint.every = False, a.log_every, 0
    cfg.compile = False  # its one-time cost (seconds, varying) would swamp short budgets
    return cfg, warmup_iterations


def start_daemons(rack, method: str, workers: int, a) -> list[subprocess.Popen]:
    """The aggregation processes of ``method`` in ``rack``, listening: the switch daemon in the
    (core) switch namespace and one per ToR, its ``--parent`` the core (switch methods); the
    parameter server (``ps``, ``async-ps``); none for the ring. The first one's final counters
    are what the run reports of it."""
    py = [sys.executable, "-m"]
    if method in ("ps", "async-ps"):
        argvs = [("ps", [*py, "gmi_drl.comm.ps", "--bind", f"0.0.0.0:{PS_PORT}", "--workers",
                         str(workers)])]
    elif method == "ring":
        argvs = []
    else:
        serve = [*py, "gmi_drl.comm.switch", "serve", "--bind", f"0.0.0.0:{SWITCH_PORT}",
                 "--mtu", str(a.mtu), "--stats-interval", "0", "--member-timeout", "120"]
        argvs = [(rack.root, serve)] + [
            (f"t{j}", [*serve, "--parent", f"{rack.tor_parent_ip[j]}:{SWITCH_PORT}",
                       "--member-id", str(j), "--switch-id", str(j + 1)])
            for j in range(rack.tors)]
    daemons = []
    try:
        for role, argv in argvs:
            daemons.append(rack.popen(role, argv, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))
            line = daemons[-1].stdout.readline()
            if not line.startswith("listening on"):
                raise RuntimeError(f"{role} daemon did not start: {line.strip()!r}")
    except BaseException:
        stop_daemons(daemons)
        raise
    return daemons


def stop_daemons(daemons: list[subprocess.Popen]) -> str:
    """Terminate ``daemons``; the first one's last output (its closing counters)."""
    tails = []
    for d in daemons:
        d.terminate()
        try:
            tails.append(d.communicate(timeout=20)[0])
        except subprocess.TimeoutExpired:
            d.kill()
            tails.append(d.communicate()[0])
    return tails[0] if tails else ""


def run_method(rack, workload: str, method: str, workers: int, a, out: Path) -> dict:
    """Train ``workload`` with ``workers`` GMIs reducing by ``method`` in ``rack`` (1 worker:
    ``rack`` None, one GMI in this process, no reduction) and measure it.

    Raises:
        Exception: whatever the daemons or the training raised (the caller reports it)."""
    from gmi_drl.train import train

    cfg, warmup_iterations = workload_config(workload, workers, a)
    cfg.run_dir = str(out / workload / f"{workers}w" / method)
    if workers > 1:
        cfg.gmi.netns = ",".join(rack.ns[f"w{i}"] for i in range(workers))
        cfg.gmi.reduction = {"ring": "ring", "ps": "ps", "async-ps": "ps"}.get(method, "switch")
        if cfg.gmi.reduction == "switch":
            cfg.gmi.switch_addr = ",".join(f"{gw}:{SWITCH_PORT}" for gw in rack.worker_gateway)
        if cfg.gmi.reduction == "ps":
            cfg.gmi.ps_addr = f"{rack.ps_ip}:{PS_PORT}"
        cfg.gmi.staleness = (int(method[2:]) if method.startswith("S=") else
                             a.async_staleness if method in ("async-ps", "async-switch") else 0)
        if method == "async-switch":
            cfg.gmi.threshold = a.threshold or workers
    daemons = start_daemons(rack, method, workers, a) if workers > 1 else []
    tail = ""
    try:
        result = train(cfg)
    finally:
        tail = stop_daemons(daemons)
    with open(Path(cfg.run_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    # (env steps of every GMI, seconds since the loop began) at each logged iteration:
    # global_step / perf/sps
    # (iteration, seconds since the loop began) at each logged iteration: global_step /
    # perf/sps; a row's phase figures are means per iteration since the row before
    batch = cfg.batch_size
    elapsed = sorted((int(r["global_step"]) // batch, int(r["global_step"]) / float(r["value"]))
                     for r in rows if r["name"] == "perf/sps" and float(r["value"]) > 0)
    timed = [e for e in elapsed if e[0] > warmup_iterations]  # from the first gradient step's end
    per_iteration = statistics.median((b[1] - a_[1]) / (b[0] - a_[0])
                                      for a_, b in itertools.pairwise(timed))
    waits = [(int(r["global_step"]) // batch, float(r["value"])) for r in rows
             if r["name"] == "perf/update/allreduce_s"]
    spans = [k - j for j, k in itertools.pairwise([0] + [k for k, _ in waits])]
    returns = result.episode_returns
    server = dict(zip(tail.split()[::2], tail.split()[1::2]))  # the server's closing counters
    return {"iteration_s": per_iteration, "loop": elapsed[-1][1],
            "sps": (timed[-1][0] - timed[0][0]) * batch / (timed[-1][1] - timed[0][1]),
            "aggregation_s": statistics.median([w for _, w in waits][1:]
                                               or [w for _, w in waits] or [float("nan")]),
            "share": sum(n * w for n, (_, w) in zip(spans, waits)) / elapsed[-1][1],
            "final": float(returns[-20:].mean()) if len(returns) else float("nan"),
            "final10": (float(returns[-WINDOW:].mean()) if len(returns) >= WINDOW
                        else float("nan")),
            "episodes": (np.asarray(result.episode_steps) / cfg.batch_size, returns,
                         np.asarray(result.episode_wall_s)),
            "breakdown": breakdown(rows, warmup_iterations * batch),
            "applied_dropped": (f"{server['applied']}/{server['dropped']}"
                                if method == "async-ps" else "-"),
            "identical": len(set(result.weight_digests)) == 1,
            "asynchronous": method == "async-ps"}  # (async-switch: identical after each drain)


def attempt(rack, workload: str, method: str, workers: int, a, out: Path) -> dict:
    """`run_method`, or ``{"failed": reason}`` when it raised (the reason: the root cause's
    type and first line, cut at a word to about 160 characters)."""
    print(f"{workload}: training {method} with {workers} worker(s) ...", flush=True)
    try:
        return run_method(rack, workload, method, workers, a, out)
    except Exception as e:  # noqa: BLE001 -- one method failing must not stop the others
        cause = e
        while cause.__cause__ is not None:  # (RunStopped chains what stopped the run)
            cause = cause.__cause__
        why = f"{type(cause).__name__}: {(str(cause).strip().splitlines() or [''])[0]}"
        print(f"  failed: {why}", flush=True)
        return {"failed": why if len(why) <= 160 else why[:160].rsplit(" ", 1)[0] + " ..."}


def breakdown(rows: list[dict], warmup_steps: int) -> tuple[float, float, float]:
    """Medians over the logged rows after the warm-up's ``warmup_steps`` env steps of GMI 0's
    seconds per iteration in computation (`COMPUTATION`), aggregation (``allreduce``) and
    weight update (``optimizer``)."""
    per_step: dict[int, list[float]] = {}
    for r in rows:
        name = r["name"]
        k = ("computation" if name in COMPUTATION else
             "aggregation" if name == "perf/update/allreduce_s" else
             "update" if name == "perf/update/optimizer_s" else None)
        if k is not None:
            parts = per_step.setdefault(int(r["global_step"]), [0.0, 0.0, 0.0])
            parts[("computation", "aggregation", "update").index(k)] += float(r["value"])
    timed = [v for step, v in sorted(per_step.items()) if step > warmup_steps] or [
        [float("nan")] * 3]
    return tuple(statistics.median(p[i] for p in timed) for i in range(3))


def to_target(episodes: tuple[np.ndarray, np.ndarray, np.ndarray],
              target: float) -> tuple[float, float]:
    """(training iterations, loop seconds) at the first episode with which the mean of the
    last `WINDOW` episodes reaches ``target``; NaNs if it never does."""
    iterations, returns, wall = episodes
    for i in range(WINDOW - 1, len(returns)):
        if returns[i - WINDOW + 1:i + 1].mean() >= target:
            return float(iterations[i]), float(wall[i])
    return float("nan"), float("nan")


def print_tables(results: dict[str, dict[str, dict]], workers: int, a) -> None:
    """The per-method tables (Fig. 12 / Table 3-5) of one worker count; a failed method's row
    says why."""
    print(f"\n{workers} GMIs ({topology(workers, a)}), links {a.rate_mbit:g} Mbit/s tbf, MTU "
          f"{a.mtu}, seed {a.seed}; training iterations {a.iterations}")
    print("| workload | method | s / iteration | aggregation s / iteration | end-to-end s | "
          "aggregation share | final return | identical weights | speed-up over ps "
          "(iteration, end-to-end) |\n|---|---|---:|---:|---:|---:|---:|---|---|")
    for workload, by_method in results.items():
        ps = by_method.get("ps")
        ps = None if ps is None or "failed" in ps else ps
        for method, r in by_method.items():
            if "failed" in r:
                print(f"| {workload} | {method} | failed: {r['failed']} |")
                continue
            vs = (f"{ps['iteration_s'] / r['iteration_s']:.2f}x, {ps['loop'] / r['loop']:.2f}x"
                  if ps else "-")
            same = "n/a (async)" if r["asynchronous"] else "yes" if r["identical"] else "NO"
            print(f"| {workload} | {method} | {r['iteration_s']:.3f} | {r['aggregation_s']:.3f} | "
                  f"{r['loop']:.1f} | {r['share']:.1%} | {r['final']:.1f} | {same} | {vs} |")
    print(f"\nTo the same final average reward (mean of the last {WINDOW} episodes of GMI 0; "
          "target: the lowest final average of the methods), and the breakdown of an "
          "iteration (medians, s):")
    print("| workload | method | final average | target | iterations to target | s to target | "
          "computation s | aggregation s | weight update s | server applied/dropped |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for workload, by_method in results.items():
        done = {m: r for m, r in by_method.items() if "failed" not in r}
        target = min((r["final10"] for r in done.values()), default=float("nan"))
        for method, r in done.items():
            its, secs = to_target(r["episodes"], target)
            comp, agg, upd = r["breakdown"]
            print(f"| {workload} | {method} | {r['final10']:.1f} | {target:.1f} | {its:.0f} | "
                  f"{secs:.1f} | {comp:.3f} | {agg:.3f} | {upd:.4f} | {r['applied_dropped']} |")


def print_scalability(results: dict[int, dict[str, dict[str, dict]]], a) -> None:
    """The scalability table: per workload, method and worker count, seconds per iteration,
    aggregate env steps per second after the warm-up and the speed-up over 1 worker's."""
    counts = [n for n in a.workers if n > 1]
    print(f"\nScalability (throughput: aggregate env steps/s of the training loop after the "
          f"warm-up; speed-up over 1 worker's, ideal = workers); {topology(counts[-1], a)} "
          f"at the most; cells: s / iteration, env steps/s, speed-up")
    print("| workload | method | " + " | ".join(f"{n} worker{'s' * (n > 1)}" for n in a.workers) + " |\n|---|---|"
          + "---|" * len(a.workers))
    for workload in a.workloads:
        one = results.get(1, {}).get(workload, {}).get("single")
        base = one["sps"] if one and "failed" not in one else None
        for method in a.methods:
            cells = []
            for n in a.workers:
                r = (one if n == 1 else results[n][workload][method])
                if r is None or "failed" in r:
                    cells.append(f"failed: {r['failed']}" if r else "-")
                    continue
                vs = f"{r['sps'] / base:.2f}x" if base else "-"
                cells.append(f"{r['iteration_s']:.3f} s, {r['sps']:,.0f}/s, {vs}")
            print(f"| {workload} | {method} | " + " | ".join(cells) + " |", flush=True)


def topology(workers: int, a) -> str:
    """The rack of ``workers`` in words."""
    if workers == 1:
        return "1 GMI, no reduction"
    if workers <= 4:
        return "1 switch"
    return f"{-(-workers // a.per_tor)} ToR x {a.per_tor} + core"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/switch-training",
                   help="directory of the run directories (a timestamped subdirectory per "
                        "invocation)")
    p.add_argument("--workloads", nargs="+", default=["dqn-pong", "a2c-qbert", "ppo-hopper",
                                                       "ddpg-halfcheetah"],
                   choices=["dqn-pong", "a2c-qbert", "ppo-hopper", "ddpg-halfcheetah"],
                   help="workloads to train (the table of the module doc)")
    p.add_argument("--methods", nargs="+", default=list(METHODS),
                   choices=METHODS,
                   help="switch: synchronous through the switch; S=1, S=2: stale-sync with that "
                        "bound; ps: parameter server; ring: gloo ring; async-ps: asynchronous "
                        "parameter server with bound --async-staleness; async-switch: "
                        "asynchronous switch (--threshold, --async-staleness)")
    p.add_argument("--async-staleness", type=int, default=3,
                   help="staleness bound S of async-ps and async-switch (the paper's 3; >= 0)")
    p.add_argument("--threshold", type=int, default=None,
                   help="async-switch: gradients the switch aggregates before it broadcasts "
                        "(H, 1 <= H <= every worker count; default: the worker count)")
    p.add_argument("--workers", type=int, nargs="+", default=[4],
                   help="GMIs, one worker namespace and link each; several counts: one rack "
                        "each and the scalability table; 1: one GMI without reduction, the "
                        "speed-ups' denominator")
    p.add_argument("--per-tor", type=int, default=3,
                   help="workers per ToR switch of a rack of more than 4 workers (a tree under "
                        "one core; >= 1)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every workload's training iterations by this (> 0; each "
                        "workload trains at least 2 iterations)")
    p.add_argument("--seed", type=int, default=1, help="seed of every run")
    p.add_argument("--log-every", type=int, default=1,
                   help="iterations per metrics row (cfg.log.log_every); the replay "
                        "actor-critics (DDPG) drain stale-sync and threshold steps only at "
                        "logged iterations")
    p.add_argument("--rate-mbit", type=float, default=100.0,
                   help="tbf rate of every link, both directions, Mbit/s (> 0)")
    p.add_argument("--mtu", type=int, default=9000,
                   help="MTU of the links and the switch daemon's packets, bytes")
    a = p.parse_args(argv)
    a.workers = sorted(set(a.workers))
    if a.workers[0] < 1 or a.workers == [1]:
        p.error(f"--workers {' '.join(map(str, a.workers))}: counts >= 1, at least one >= 2 "
                "(gradients are aggregated between GMIs)")
    reduced = [n for n in a.workers if n > 1]
    if a.async_staleness < 0:
        p.error(f"--async-staleness {a.async_staleness}: must be >= 0")
    if a.threshold is not None and not 1 <= a.threshold <= reduced[0]:
        p.error(f"--threshold {a.threshold}: must be in [1, the fewest workers={reduced[0]}]")
    if a.per_tor < 1 or a.log_every < 1:
        p.error(f"--per-tor {a.per_tor} and --log-every {a.log_every}: must be >= 1")
    for flag, value in (("--scale", a.scale), ("--rate-mbit", a.rate_mbit)):
        if value <= 0:
            p.error(f"{flag} {value:g}: must be > 0")
    base = {"dqn-pong": 40, "a2c-qbert": 20, "ppo-hopper": 3, "ddpg-halfcheetah": 200}
    a.iterations = {k: max(2, round(v * a.scale)) for k, v in base.items()}

    from gmi_drl.comm.switch.netns import Rack, netns_available

    why = netns_available()
    if why:
        sys.exit(f"benchmarks/switch_training.py {why}")
    out = Path(a.out) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    t0 = time.monotonic()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    results: dict[int, dict[str, dict[str, dict]]] = {}
    if 1 in a.workers:
        results[1] = {w: {"single": attempt(None, w, "single", 1, a, out)} for w in a.workloads}
    for n in reduced:
        results[n] = {w: {} for w in a.workloads}
        with Rack(n, None if n <= 4 else a.per_tor, a.rate_mbit, a.mtu, with_ps=True) as rack:
            for workload in a.workloads:
                for method in a.methods:
                    results[n][workload][method] = attempt(rack, workload, method, n, a, out)
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for n in reduced:
        print_tables(results[n], n, a)
    if len(a.workers) > 1:
        print_scalability(results, a)
    print(f"\nrun directories under {out}; {time.monotonic() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
