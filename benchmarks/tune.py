"""`gmi-drl tune` (GMI-DRL Algorithm 2) against the exhaustive grid, and the cost model's error.

For each task: every (GMIs per device, num_envs) point of the grid is profiled (fresh, no cache),
then `tune` searches the same grid with a fresh cache. Printed: every point of both (the
search's with its Sat), the grid's best point, tune's pick, the pick's throughput over the
grid's best (both as the grid measured them, so probe noise is not counted twice; tune's own
figure beside it), and the search's wall time over the grid's.
Beside it, Algorithm 2 replayed on the grid's own figures: what the search would cost and pick
if its probes returned exactly what the grid measured (its behaviour without a second draw of
probe noise).
Then the cost model (`gmi_drl.gmi.cost`): from each num_envs' one-GMI point alone, the predicted
throughput of every larger GMI count at that num_envs beside the grid's measurement, per template
and model variant (`gmi_drl.tune.predict`): median and worst absolute error. With
``--model-repeats K``, every grid point is probed K - 1 more times (in rounds over the grid) and
the same table is printed again from the medians of the K probes: the model's error with less of
the probes' own noise (11-34% between probes of one point on a 2-core host) in both its inputs
and what it is compared with.

    python benchmarks/tune.py                      # Hopper-v5 and CartPole-v1, PPO
    python benchmarks/tune.py --tasks CartPole-v1 --envs-max 64
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

from gmi_drl.config import preset, validate
from gmi_drl.gmi.devices import discover
from gmi_drl.tune import (Point, Tuner, TuneOptions, check_options, compare, envs_grid, search,
                              tune)

TASK_FLAGS = {"Hopper-v5": {"num_steps": 64}, "CartPole-v1": {}}
"""per task: PPO fields changed from the preset (Hopper: a 64-step horizon, as GPU-simulator
PPO runs use, so a 256-env batch fits a short probe)"""


def config(task: str):
    cfg = preset("auto", task, "ppo")
    for name, value in TASK_FLAGS.get(task, {}).items():
        setattr(cfg.algo, name, value)
    cfg.log.tensorboard = False
    validate(cfg)
    return cfg


def run_task(task: str, args) -> None:
    cores = len(discover().cpu_cores)
    max_gmis = args.max_gmis or cores
    grid = envs_grid(args.envs_min, args.envs_max)
    cfg = config(task)
    print(f"\n## {task} (PPO, num_steps {cfg.algo.num_steps}): GMIs {max_gmis}..1 x num_envs "
          f"{grid[0]}..{grid[-1]}, {cores} cores, probes {args.warmup} + >= {args.iterations} "
          f"iterations, >= {args.min_steps:,} env steps and >= {args.min_seconds} s\n",
          flush=True)
    tuner = Tuner(cfg, 1, cores, args.warmup, args.iterations, args.min_steps, args.timeout_s,
                  min_seconds=args.min_seconds)
    start, points = time.perf_counter(), []
    for gmis in range(max_gmis, 0, -1):
        for n in grid:
            points.append(tuner.profile(gmis, n))
            p = points[-1]
            print(f"grid: {gmis} GMIs x {n:>3} envs: "
                  + (f"{p.top:>9,.0f} env steps/s, {p.mem / 2**20:,.0f} MiB, {p.seconds:.1f} s"
                     if p.runnable else f"not runnable ({p.reason})"), flush=True)
    grid_s = time.perf_counter() - start
    measured = {(p.gmis, p.num_envs): p for p in points if p.runnable}
    best = max(measured.values(), key=lambda p: p.top)

    with tempfile.TemporaryDirectory() as out:
        options = TuneOptions(max_gmis=max_gmis, envs_min=args.envs_min, envs_max=args.envs_max,
                              alpha=args.alpha, warmup=args.warmup, iterations=args.iterations,
                              min_steps=args.min_steps, min_seconds=args.min_seconds,
                              probe_timeout_s=args.timeout_s, out=out)
        report = tune(cfg, options)
    for p in report.search.points:
        sat = "" if p.sat is None else f", Sat {p.sat:.2f}"
        print(f"tune: {p.gmis} GMIs x {p.num_envs:>3} envs: "
              + (f"{p.top:>9,.0f} env steps/s, {p.mem / 2**20:,.0f} MiB, {p.seconds:.1f} s{sat}"
                 if p.runnable else f"not runnable ({p.reason})"), flush=True)
    pick = report.chosen
    print("\n| | GMIs | num_envs | env steps/s | wall s | points |\n|---|---|---|---|---|---|")
    print(f"| grid best | {best.gmis} | {best.num_envs} | {best.top:,.0f} | {grid_s:.0f} | "
          f"{len(points)} |")
    # the pick as the grid measured it (0 where the grid's probe of it did not run)
    in_grid = measured.get((pick.gmis, pick.num_envs)) if pick is not None else None
    grid_top = in_grid.top if in_grid is not None else 0.0
    print(f"| tune pick ({report.chosen_by}) | {pick.gmis if pick else '-'} | "
          f"{pick.num_envs if pick else '-'} | {grid_top:,.0f} (tune's probe: "
          f"{pick.top if pick else 0:,.0f}) | {report.wall_s:.0f} | {len(report.search.points)} |")
    print(f"\npick / grid best: {grid_top / best.top:.2f}x (target >= 0.9); search time / "
          f"grid time: {report.wall_s / grid_s:.0%} (target <= 40%)")
    replay(points, max_gmis, grid, tuner, args.alpha, best)

    model_errors(measured, grid, cores, tuner.measured_bw, "the grid's one probe per point")
    if args.model_repeats > 1:
        probes = {key: [p] for key, p in measured.items()}
        for _ in range(args.model_repeats - 1):  # rounds over the grid, as the grid ran
            for key in probes:
                probes[key].append(tuner.profile(*key))
        model_errors({key: median_point(ps) for key, ps in probes.items()}, grid, cores,
                     tuner.measured_bw, f"the median of {args.model_repeats} probes per point, "
                     "for the model's terms and for what it predicts")


def median_point(probes: list[Point]) -> Point:
    """One point from several probes of it: the median of its throughput and of every term of
    the cost model, each taken on its own (the runnable probes; the first where none ran)."""
    runnable = [p for p in probes if p.runnable] or probes[:1]
    keys = set.intersection(*(set(p.terms) for p in runnable))
    return dataclasses.replace(runnable[0], top=statistics.median(p.top for p in runnable),
                               terms={k: statistics.median(p.terms[k] for p in runnable)
                                      for k in keys})


def model_errors(measured: dict[tuple[int, int], Point], grid: list[int], cores: int,
                 bw: float | None, source: str) -> None:
    """The cost model's tables: from each num_envs' 1-GMI point, its predictions of the larger
    GMI counts at that num_envs against ``measured``; median and worst absolute error per
    template and variant, then every point of the ``share`` variant (where the worst is)."""
    errors: dict[tuple[str, str], list[float]] = {}
    rows = []
    for n in grid:
        ref = measured.get((1, n))
        if ref is None or not ref.runnable:
            continue
        same_n = [p for (g, m), p in measured.items() if m == n and g > 1]
        for pred in compare(ref, same_n, cores, bw):
            if pred.error is not None:
                errors.setdefault((pred.template, pred.variant), []).append(abs(pred.error))
                if pred.variant == "share":
                    rows.append((n, pred))
    print(f"\ncost model from the 1-GMI point of each num_envs, predicting 2+ GMIs at that "
          f"num_envs, {source} (target: within 25%):\n")
    print("| template | model | points | median abs error | worst |\n|---|---|---|---|---|")
    for (template, variant), errs in sorted(errors.items()):
        print(f"| {template} | {variant} | {len(errs)} | {statistics.median(errs):.1%} | "
              f"{max(errs):.1%} |")
    print("\n| num_envs | GMIs | template | predicted (share) | measured | error |\n"
          "|---|---|---|---|---|---|")
    for n, pred in sorted(rows, key=lambda r: (r[1].template, r[0], r[1].gmis)):
        print(f"| {n} | {pred.gmis} | {pred.template} | {pred.predicted:,.0f} | "
              f"{pred.measured:,.0f} | {pred.error:+.1%} |")


def replay(points: list[Point], max_gmis: int, grid: list[int], tuner: Tuner, alpha: float,
           best: Point) -> None:
    """Algorithm 2 on the grid's measured points (copies): the points it would profile, their
    probe seconds over the grid's, and its pick."""
    by_key = {(p.gmis, p.num_envs): p for p in points}
    result = search(range(max_gmis, 0, -1), grid,
                    lambda g, n: dataclasses.replace(by_key[(g, n)]), tuner.estimate, alpha)
    cost = sum(p.seconds for p in result.points)
    line = (f"Algorithm 2 replayed on the grid's figures: {len(result.points)} of {len(points)} "
            f"points, {cost / sum(p.seconds for p in points):.0%} of the grid's probe seconds")
    if result.best is None:
        line += ", no pick (every inner loop ended at its second point)"
    else:
        n, g = result.best
        line += f", pick {g} x {n}: {by_key[(g, n)].top / best.top:.2f}x the grid best"
    print(line)


def _check(parser: argparse.ArgumentParser, args) -> None:
    """Refuse, as usage errors and before any probe, what `tune` would refuse and unknown
    tasks."""
    try:
        check_options(TuneOptions(max_gmis=args.max_gmis, envs_min=args.envs_min,
                                  envs_max=args.envs_max, alpha=args.alpha, warmup=args.warmup,
                                  iterations=args.iterations, min_steps=args.min_steps,
                                  min_seconds=args.min_seconds))
    except ValueError as e:
        parser.error(str(e))
    if args.envs_max < args.envs_min:
        parser.error(f"--envs-min {args.envs_min} is above --envs-max {args.envs_max}")
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s {args.timeout_s:g}: must be > 0")
    for task in args.tasks:
        try:
            config(task)
        except ValueError as e:
            parser.error(f"--tasks {task}: {' '.join(str(e).split())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["Hopper-v5", "CartPole-v1"],
                        help="tasks to search, PPO with the task's preset (TASK_FLAGS: Hopper-v5 "
                             "with a 64-step horizon)")
    parser.add_argument("--max-gmis", type=int, default=None,
                        help="most GMIs per device, searched down to 1 (>= 1; default "
                             "%(default)s: every CPU core)")
    parser.add_argument("--envs-min", type=int, default=2,
                        help="smallest num_envs per GMI of the doubling grid (>= 1)")
    parser.add_argument("--envs-max", type=int, default=256,
                        help="largest num_envs per GMI of the grid (>= --envs-min)")
    parser.add_argument("--alpha", type=float, default=0.1,
                        help="Algorithm 2's saturation threshold: Sat = R_top / R_mem below it "
                             "ends a GMI count's num_envs loop (>= 0)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="iterations each probe runs before it measures (>= 0)")
    parser.add_argument("--iterations", type=int, default=1,
                        help="iterations each probe measures, at least (>= 1)")
    parser.add_argument("--min-steps", type=int, default=5_000,
                        help="env steps each probe measures, at least (>= 0)")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="seconds each probe measures, at least (>= 0)")
    parser.add_argument("--timeout-s", type=float, default=180.0,
                        help="seconds after which a probe counts as hung: killed, its point not "
                             "runnable (> 0)")
    parser.add_argument("--model-repeats", type=int, default=1,
                        help="probes per grid point for a second cost-model table, of medians "
                             "(>= 1; 1: the grid's probes only)")
    args = parser.parse_args()
    _check(parser, args)
    if args.model_repeats < 1:
        parser.error(f"--model-repeats {args.model_repeats}: must be >= 1")
    for task in args.tasks:
        run_task(task, args)


if __name__ == "__main__":
    main()
