"""Asynchronous training (GMI-DRL §4.2, §5.1): channels, templates, and the async trainer users
pick today, in one invocation.

    .venv/bin/python benchmarks/async_training.py                         # every part, 3 repeats
    .venv/bin/python benchmarks/async_training.py --parts channels --repeats 5
    .venv/bin/python benchmarks/async_training.py --parts sample-factory --sf-python PYTHON

Part ``channels`` (the GMI-DRL paper Table 8): APPO with multi-channel (MCC: one channel per field,
the compressor joining fragments into transfers) against uni-channel experience sharing (UCC:
each env step's whole tuple as one message), on Hopper-v5 and on Pong-v5; runs alternate.
PPS = env steps (agent predictions) per second of every serving GMI; TTOP = samples per second
the trainer learned from; both steady (between the first and the last logged update, so the
one-time compile is left out). Target: MCC TTOP >= 1.3x UCC.

Part ``channel-only``: the channels alone, with real processes and the real fragment shapes
of Hopper-v5 and Pong-v5 but no env and no learning: data-only serving processes copy each
step's rows into the dispenser, one batcher stacks batches; samples per second it receives.
On a CPU the Pong trainer (the Nature CNN) learns from ~50 samples/s, so the end-to-end Pong
runs of ``channels`` are bound by it whatever the channel; this part shows what each channel
design can carry.

Part ``sync`` (the GMI-DRL paper Fig. 11): APPO in the async_training template (2 serving GMIs x 8
envs, 1 trainer GMI) against PPO in the sync_training template (2 holistic GMIs x 8 envs) on
Hopper-v5, both 2,048 samples per update, 4 epochs of 4 minibatches: the same cores (every core
of this machine), the same env count. Target: APPO env steps/s >= 1.3x sync PPO's.

Part ``splits``: double-buffered sampling (``--async.env-splits``, Sample Factory's
``worker_num_splits``): each serving GMI's envs in one pool against two pools, acting on one
half while the C++ threads step the other. First a serving role alone (the real `ServingRole`
with its preset's policy and a thread that drains its channel; env steps/s over 2-second
windows, median of 5) on Hopper-v5 and Pong-v5, then APPO end to end on Hopper-v5 (PPS and
TTOP as above).

Part ``bridge``: the experience channels across hosts (``--placement ray``: one Ray actor per
GMI, a local Ray instance, every GMI on this one host) against shared memory (``--placement
local``): APPO Hopper-v5, 2 serving GMIs x 8 envs, with 1 trainer GMI, then with 2 trainer GMIs
(each with its own bridge, the serving GMIs spreading transfers by queued work, the trainers
reducing through a gloo ring; on one host, through shared memory); PPS and TTOP as above, runs
alternating; ratios at equal trainer counts.

Part ``sample-factory``: Sample Factory 2.1.1's APPO (`sf_examples.mujoco.train_mujoco`) on
Hopper with the same env count (2 workers x 8 envs), 1 learner, 64-step rollouts, batch 2,048,
on CPU, run with the interpreter of its own venv (``--sf-python``; it needs gymnasium 0.29.1
and numpy < 2, so it cannot share the project's: make it with ``python -m venv /tmp/sfvenv &&
/tmp/sfvenv/bin/pip install sample-factory==2.1.1 'gymnasium[mujoco]==0.29.1' 'numpy<2'
torch``). Its env is Hopper-v4 (gymnasium 0.29 has no v5; same model and dynamics). Its
steady throughput is its env frames between its first and last throughput reports (every 5 s)
over their time; whole run: its own final FPS figure, and gmi-drl's env steps over the
``train`` call (process start-up included). Target: gmi-drl APPO env steps/s >= 1.0x Sample
Factory's.

Every figure is the median over ``--repeats`` runs (seeds 1..repeats). ``--device cuda`` puts
the learners of every compared gmi-drl run on the GPU (the envs step on CPU cores either way;
the Sample Factory part stays on the CPU).
"""

from __future__ import annotations

import logging
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from gmi_drl.config import TrainConfig, preset
from gmi_drl.train import train


@dataclass
class Args:
    parts: list[Literal["channels", "channel-only", "sync", "splits", "bridge",
                        "sample-factory"]] = field(
        default_factory=lambda: ["channel-only", "channels", "sync", "splits", "bridge",
                                 "sample-factory"])
    """which comparisons to run"""
    tasks: list[str] = field(default_factory=lambda: ["Hopper-v5", "Pong-v5"])
    """tasks of the channels part (Pong's trainer is slow on a CPU: a few minutes per run)"""
    channel_seconds: float = 5.0
    """seconds each channel-only measurement lasts"""
    repeats: int = 3
    """runs per configuration (median reported)"""
    hopper_steps: int = 204_800
    """env steps trained on per Hopper run (100 updates of 2,048)"""
    pong_steps: int = 5_120
    """env steps trained on per Pong run (10 updates of 512)"""
    serving_gmis: int = 2
    """serving GMIs of the APPO runs"""
    envs_per_serving: int = 8
    """env.num_envs of each serving GMI in the APPO runs (and of each PPO GMI and Sample
    Factory worker they are compared with); the channel-only part keeps 8"""
    trainer_share: float | None = None
    """gmi.trainer_share of the APPO runs (None: every GMI shares the cores)"""
    sf_python: str = "/tmp/sfvenv/bin/python"
    """the interpreter of Sample Factory's venv"""
    sf_worker_num_splits: int = 2
    """Sample Factory's double-buffered sampling (its MuJoCo default 2: each worker steps half
    its envs while the other half waits for actions); 1 turns it off"""
    sf_steps: int = 204_800
    """env steps per run of the Sample Factory comparison (it reports every 5 s)"""
    device: Literal["cpu", "cuda"] = "cpu"
    """the learners' device (``--device`` of every run compared: trainer GMIs of the APPO runs,
    the GMIs of sync PPO); envs step on CPU cores either way"""
    out_dir: str | None = None
    """where the runs go (default: a new directory under the system's temp)"""


@dataclass
class Rates:
    pps: float
    """env steps of every serving GMI per second (steady)"""
    ttop: float
    """samples trained on per second (steady)"""
    wall_s: float
    env_steps: float
    """env steps collected in the whole run"""


def _steady(run_dir: Path) -> Rates:
    """Steady rates from a run's metrics.csv: the change between the first and the last logged
    update of ``global_step`` (TTOP) and of ``async/env_steps`` or ``global_step`` (PPS)."""
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    by_name: dict[str, list[tuple[float, float, float]]] = {}
    for step, wall, name, value in rows:
        by_name.setdefault(name, []).append((float(step), float(wall), float(value)))
    sps = by_name["perf/sps"]
    (s0, w0, _), (s1, w1, _) = sps[0], sps[-1]
    ttop = (s1 - s0) / (w1 - w0)
    env = by_name.get("async/env_steps")
    pps = (env[-1][2] - env[0][2]) / (env[-1][1] - env[0][1]) if env else ttop
    return Rates(pps, ttop, w1, env[-1][2] if env else s1)


def _appo(task: str, channel: str, steps: int, seed: int, serving: int, out: Path,
          trainer_share: float | None = None, splits: int = 1,
          num_envs: int | None = None) -> TrainConfig:
    cfg = preset("auto", task, "appo")
    cfg.gmi.serving_gmis, cfg.async_.channel = serving, channel
    cfg.async_.env_splits = splits
    if num_envs is not None:
        cfg.env.num_envs = num_envs
    cfg.gmi.trainer_share = trainer_share
    cfg.total_timesteps, cfg.seed, cfg.run_dir = steps, seed, str(out)
    cfg.log.tensorboard, cfg.log.log_every, cfg.checkpoint.every = False, 1, 0
    return cfg


def _ppo_sync(steps: int, seed: int, out: Path, num_gmis: int, num_envs: int) -> TrainConfig:
    cfg = preset("mujoco", "Hopper-v5", "ppo")
    cfg.gmi.num_gmis, cfg.env.num_envs = num_gmis, num_envs
    cfg.algo.num_steps, cfg.algo.num_minibatches, cfg.algo.update_epochs = 128, 4, 4
    cfg.total_timesteps, cfg.seed, cfg.run_dir = steps, seed, str(out)
    cfg.log.tensorboard, cfg.log.log_every, cfg.checkpoint.every = False, 1, 0
    return cfg


def _run(cfg: TrainConfig, device: str = "cpu") -> Rates:
    cfg.device = device
    train(cfg)
    return _steady(Path(cfg.run_dir))


def _median(rates: list[Rates], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in rates)


def part_channels(args: Args, out: Path) -> None:
    print("\n## channels: MCC vs UCC (APPO, "
          f"{args.serving_gmis} serving GMIs x {args.envs_per_serving} envs, 1 trainer GMI)\n")
    print("| task | channel | PPS (env steps/s) | TTOP (trained samples/s) | runs |\n"
          "|---|---|---:|---:|---:|")
    for task in args.tasks:
        steps = args.pong_steps if task.startswith("Pong") else args.hopper_steps
        rates: dict[str, list[Rates]] = {"multi": [], "uni": []}
        for seed in range(1, args.repeats + 1):
            for channel in ("multi", "uni"):
                cfg = _appo(task, channel, steps, seed, args.serving_gmis,
                            out / f"channels-{task}-{channel}-{seed}",
                            num_envs=args.envs_per_serving)
                rates[channel].append(_run(cfg, args.device))
        for channel, rs in rates.items():
            print(f"| {task} | {channel} | {_median(rs, 'pps'):,.0f} | {_median(rs, 'ttop'):,.0f} "
                  f"| {len(rs)} |")
        ratio = _median(rates["multi"], "ttop") / _median(rates["uni"], "ttop")
        pps = _median(rates["multi"], "pps") / _median(rates["uni"], "pps")
        print(f"| {task} | MCC / UCC | {pps:.2f}x | {ratio:.2f}x (target >= 1.3) | |", flush=True)


def _serve_fragments(plan, serving: int, seconds: float) -> None:
    """A serving GMI that only moves data: each step copies one row of every time-major field
    (from fixed arrays, as a collector writes what the pool and policy returned) and hands the
    step to the dispenser, for ``seconds``."""
    import numpy as np

    from gmi_drl.comm.channels import ChannelClosed, Dispenser, Fabric

    fabric = Fabric.attach(plan)
    disp = Dispenser(fabric, serving)
    rows = {f.name: np.ones(f.shape[1:], f.dtype) for f in plan.fields if f.time_major}
    next_obs = np.ones(plan.fields[0].shape[1:], plan.fields[0].dtype)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            frag = disp.begin(0)
            for t in range(plan.num_steps):
                for name, row in rows.items():
                    frag[name][t] = row
                disp.step_done(t, next_obs)
            disp.end()
    except ChannelClosed:
        pass
    finally:
        fabric.close()


def _channel_rate(task: str, channel: str, serving: int, seconds: float) -> float:
    """Samples per second a trainer's batcher receives from ``serving`` data-only serving GMI
    processes (8 envs each, APPO's fragments for ``task``), steady over ``seconds``."""
    import multiprocessing as mp

    from gmi_drl import envs
    from gmi_drl.comm.channels import Batcher, ChannelPlan, Fabric
    from gmi_drl.rollout.trajectory import fragment_fields

    cfg = preset("auto", task, "appo")
    with envs.make(task, 1, num_workers=0) as probe:
        spec = probe.spec
    T, B = cfg.algo.num_steps, 8
    plan = ChannelPlan(fragment_fields(spec.observation_space, spec.action_space, T, B), T, B,
                       serving, 1, channel)
    fabric = Fabric.create(plan)
    procs = [mp.get_context("spawn").Process(target=_serve_fragments,
                                             args=(fabric.plan, s, seconds + 30))
             for s in range(serving)]
    try:
        for p in procs:
            p.start()
        batcher = Batcher(fabric, 0, cfg.algo.fragments_per_batch)
        batcher.next(timeout_s=60)  # every process is up
        n0, t0 = batcher.fragments, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            batcher.next(timeout_s=60)
        rate = (batcher.fragments - n0) * T * B / (time.perf_counter() - t0)
    finally:
        fabric.stop()
        for p in procs:
            p.join(10)
            p.kill()
        fabric.destroy()
    return rate


def part_channel_only(args: Args, out: Path) -> None:
    print(f"\n## channels alone: samples/s into a trainer's batches ({args.serving_gmis} "
          "data-only serving processes x 8 envs, APPO's fragments; no env, no learning)\n")
    print("| task | bytes per step of 8 envs (MCC / UCC) | MCC samples/s | UCC samples/s "
          "| MCC / UCC | runs |\n|---|---|---:|---:|---:|---:|")
    for task in ("Hopper-v5", "Pong-v5"):
        rates: dict[str, list[float]] = {"multi": [], "uni": []}
        for _ in range(args.repeats):
            for channel in ("multi", "uni"):
                rates[channel].append(_channel_rate(task, channel, args.serving_gmis,
                                                    args.channel_seconds))
        m, u = statistics.median(rates["multi"]), statistics.median(rates["uni"])
        print(f"| {task} | {_step_bytes(task)} | {m:,.0f} | {u:,.0f} | {m / u:.2f}x | "
              f"{args.repeats} |", flush=True)


def _step_bytes(task: str) -> str:
    from gmi_drl import envs
    from gmi_drl.comm.channels import ChannelPlan
    from gmi_drl.rollout.trajectory import fragment_fields

    T = preset("auto", task, "appo").algo.num_steps
    with envs.make(task, 1, num_workers=0) as probe:
        spec = probe.spec
    fields = fragment_fields(spec.observation_space, spec.action_space, T, 8)
    mcc = sum(f.nbytes for f in fields) / T
    ucc = ChannelPlan(fields, T, 8, 1, 1, "uni").rings()[0][0]
    return f"{mcc:,.0f} / {ucc:,.0f}"


def part_sync(args: Args, out: Path) -> None:
    print("\n## templates: APPO async_training vs PPO sync_training, Hopper-v5, "
          f"{args.serving_gmis} x {args.envs_per_serving} envs (gmi.trainer_share "
          f"{args.trainer_share})\n")
    print("| template | env steps/s | trained samples/s | runs |\n|---|---:|---:|---:|")
    rates: dict[str, list[Rates]] = {"async (APPO)": [], "sync (PPO)": []}
    for seed in range(1, args.repeats + 1):
        rates["async (APPO)"].append(_run(_appo("Hopper-v5", "multi", args.hopper_steps, seed,
                                                args.serving_gmis, out / f"sync-appo-{seed}",
                                                args.trainer_share,
                                                num_envs=args.envs_per_serving), args.device))
        rates["sync (PPO)"].append(_run(_ppo_sync(args.hopper_steps, seed,
                                                  out / f"sync-ppo-{seed}", args.serving_gmis,
                                                  args.envs_per_serving), args.device))
    for name, rs in rates.items():
        print(f"| {name} | {_median(rs, 'pps'):,.0f} | {_median(rs, 'ttop'):,.0f} | {len(rs)} |")
    ratio = _median(rates["async (APPO)"], "pps") / _median(rates["sync (PPO)"], "pps")
    print(f"| async / sync | {ratio:.2f}x (target >= 1.3) | | |", flush=True)


def _serving_rate(task: str, num_envs: int, splits: int, windows: int = 5) -> float:
    """Env steps/s of one `ServingRole` alone (its channel drained by a thread)."""
    import threading

    import numpy as np
    import torch

    from gmi_drl import envs
    from gmi_drl.algos.appo import APPO
    from gmi_drl.comm.channels import Batcher, ChannelPlan, Dispenser, Fabric
    from gmi_drl.comm.weights import WeightStore
    from gmi_drl.rollout.acting import make_acting
    from gmi_drl.rollout.arrays import HostArrays
    from gmi_drl.rollout.trajectory import fragment_fields
    from gmi_drl.runner.roles import ServingRole

    torch.set_num_threads(1)
    cfg = preset("auto", task, "appo")
    T, per = cfg.algo.num_steps, num_envs // splits
    pools = [envs.make(task, per, seed=s * per, autoreset="same_step") for s in range(splits)]
    spec = pools[0].spec
    fields = fragment_fields(spec.observation_space, spec.action_space, T, num_envs)
    fabric = Fabric.create(ChannelPlan(fields, T, num_envs, 1, 1, "multi", 1, 4, "block"))
    store = WeightStore.create(8)
    try:
        model = APPO.acting_model(spec, cfg.model)
        acting = make_acting(model, torch.Generator().manual_seed(1), HostArrays())
        role = ServingRole(pools, model, acting, None, None, Dispenser(fabric, 0), store)
        batcher = Batcher(fabric, 0, 1)

        def drain() -> None:
            try:
                while True:
                    batcher.next()
            except Exception:  # the channels stopped
                pass

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        for _ in range(3):  # warm-up
            role.collect()
        rates = []
        for _ in range(windows):
            t0, n0 = time.perf_counter(), role.env_steps
            while time.perf_counter() - t0 < 2.0:
                role.collect()
            rates.append((role.env_steps - n0) / (time.perf_counter() - t0))
        fabric.stop()
        drainer.join(5)
        return float(np.median(rates))
    finally:
        for pool in pools:
            pool.close()
        fabric.close()
        store.close()


def part_splits(args: Args, out: Path) -> None:
    print("\n## env splits: a serving role alone, env steps/s\n")
    print("| task | envs | 1 pool | 2 pools | 2 / 1 |\n|---|---:|---:|---:|---:|")
    for task, num_envs in (("Hopper-v5", 16), ("Hopper-v5", 64), ("Pong-v5", 16)):
        one, two = (_serving_rate(task, num_envs, s) for s in (1, 2))
        print(f"| {task} | {num_envs} | {one:,.0f} | {two:,.0f} | {two / one:.2f}x |", flush=True)
    print(f"\n## env splits: APPO Hopper-v5, {args.serving_gmis} serving GMIs x "
          f"{args.envs_per_serving} envs, 1 trainer GMI\n")
    print("| env splits | PPS (env steps/s) | TTOP (trained samples/s) | runs |\n"
          "|---:|---:|---:|---:|")
    rates: dict[int, list[Rates]] = {1: [], 2: []}
    for seed in range(1, args.repeats + 1):
        for splits in rates:
            rates[splits].append(_run(_appo(
                "Hopper-v5", "multi", args.hopper_steps, seed, args.serving_gmis,
                out / f"splits-{splits}-{seed}", args.trainer_share, splits,
                args.envs_per_serving), args.device))
    for splits, rs in rates.items():
        print(f"| {splits} | {_median(rs, 'pps'):,.0f} | {_median(rs, 'ttop'):,.0f} | {len(rs)} |")
    pps = _median(rates[2], "pps") / _median(rates[1], "pps")
    ttop = _median(rates[2], "ttop") / _median(rates[1], "ttop")
    print(f"| 2 / 1 | {pps:.2f}x | {ttop:.2f}x | |", flush=True)


def part_bridge(args: Args, out: Path) -> None:
    print(f"\n## bridge: APPO Hopper-v5, {args.serving_gmis} serving GMIs x "
          f"{args.envs_per_serving} envs, shared "
          "memory vs TCP bridges (Ray actors on this host)\n")
    print("| placement | trainer GMIs | PPS (env steps/s) | TTOP (trained samples/s) | runs |\n"
          "|---|---:|---:|---:|---:|")
    setups = (("local", 1), ("ray", 1), ("local", 2), ("ray", 2))
    rates: dict[tuple[str, int], list[Rates]] = {s: [] for s in setups}
    for seed in range(1, args.repeats + 1):
        for placement, trainers in setups:
            cfg = _appo("Hopper-v5", "multi", args.hopper_steps, seed, args.serving_gmis,
                        out / f"bridge-{placement}-{trainers}-{seed}",
                        num_envs=args.envs_per_serving)
            cfg.placement, cfg.gmi.trainer_gmis = placement, trainers
            rates[(placement, trainers)].append(_run(cfg, args.device))
    for (placement, trainers), rs in rates.items():
        print(f"| {placement} | {trainers} | {_median(rs, 'pps'):,.0f} | "
              f"{_median(rs, 'ttop'):,.0f} | {len(rs)} |")
    for trainers in (1, 2):
        ray, local = rates[("ray", trainers)], rates[("local", trainers)]
        print(f"| ray / local | {trainers} | {_median(ray, 'pps') / _median(local, 'pps'):.2f}x | "
              f"{_median(ray, 'ttop') / _median(local, 'ttop'):.2f}x | |", flush=True)


_SF_REPORT = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+)\].*Total num frames: (\d+)")
_SF_TOTAL = re.compile(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)")


def _sample_factory(args: Args, seed: int, out: Path) -> tuple[float, float]:
    """One Sample Factory APPO run on Hopper: ``(steady env frames/s between its first and
    last throughput reports, its own whole-run FPS)``."""
    cmd = [args.sf_python, "-m", "sf_examples.mujoco.train_mujoco", "--env=mujoco_hopper",
           f"--experiment=hopper-{seed}", f"--train_dir={out}", f"--seed={seed}",
           "--device=cpu", f"--num_workers={args.serving_gmis}", f"--num_envs_per_worker={args.envs_per_serving}",
           f"--worker_num_splits={args.sf_worker_num_splits}", "--rollout=64",
           "--batch_size=2048",
           "--num_batches_per_epoch=4", "--num_epochs=4", "--serial_mode=False",
           "--async_rl=True", f"--train_for_env_steps={args.sf_steps}",
           "--with_wandb=False", "--save_every_sec=100000", "--keep_checkpoints=1",
           "--restart_behavior=overwrite"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"Sample Factory failed ({proc.returncode}):\n{text[-3000:]}")
    reports = [(time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
                + int(m.group(2)) / 1000, int(m.group(3)))
               for m in map(_SF_REPORT.search, text.splitlines()) if m]
    reports = [r for r in reports if r[1] > 0]  # from its first frames on
    total = _SF_TOTAL.search(text)
    whole = float(total.group(2)) if total else float("nan")
    if len(reports) < 2:
        return float("nan"), whole
    (t0, f0), (t1, f1) = reports[0], reports[-1]
    return (f1 - f0) / (t1 - t0), whole


def part_sample_factory(args: Args, out: Path) -> None:
    print("\n## APPO vs Sample Factory 2.1.1 APPO, Hopper, "
          f"{args.serving_gmis} x {args.envs_per_serving} envs, 1 learner, CPU, "
          f"{args.sf_steps:,} env steps\n")
    if not Path(args.sf_python).exists():
        print(f"Sample Factory's interpreter {args.sf_python} does not exist; see this script's "
              "docstring for its venv. Part skipped.")
        return
    print("| who | env steps/s, steady | env steps/s, whole run | runs |\n|---|---:|---:|---:|")
    gmi, gmi_whole, sf, sf_whole = [], [], [], []
    for seed in range(1, args.repeats + 1):
        cfg = _appo("Hopper-v5", "multi", args.sf_steps, seed, args.serving_gmis,
                    out / f"sf-gmi-{seed}", num_envs=args.envs_per_serving)
        t0 = time.perf_counter()
        result = train(cfg)
        rates = _steady(Path(cfg.run_dir))
        gmi.append(rates.pps)
        gmi_whole.append(rates.env_steps / (time.perf_counter() - t0))
        del result
        steady, whole = _sample_factory(args, seed, out / "sample-factory")
        sf.append(steady)
        sf_whole.append(whole)
    med = statistics.median
    print(f"| gmi-drl APPO | {med(gmi):,.0f} | {med(gmi_whole):,.0f} | {len(gmi)} |")
    print(f"| Sample Factory APPO | {med(sf):,.0f} | {med(sf_whole):,.0f} | {len(sf)} |")
    print(f"| gmi-drl / SF | {med(gmi) / med(sf):.2f}x (target >= 1.0) | "
          f"{med(gmi_whole) / med(sf_whole):.2f}x | |", flush=True)


def main(args: Args) -> None:
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="bench-async-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"runs in {out}")
    parts = {"channels": part_channels, "channel-only": part_channel_only, "sync": part_sync,
             "splits": part_splits, "bridge": part_bridge,
             "sample-factory": part_sample_factory}
    for name in args.parts:
        parts[name](args, out)


if __name__ == "__main__":
    main(tyro.cli(Args))
