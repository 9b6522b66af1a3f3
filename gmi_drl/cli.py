"""``gmi-drl``: the command line. The only module that prints.

    gmi-drl train ppo --env.task-id Hopper-v5 --env.num-envs 16 --total-timesteps 1000000 --seed 1
    gmi-drl train ppo --preset demo
    gmi-drl train ppo --resume runs/Hopper-v5-ppo-20260101-120000 --total-timesteps 2000000
    gmi-drl train ppo --gmi.num-gmis 4 --placement ray [--ray.address auto|HOST:PORT]
    gmi-drl tune --env.task-id Hopper-v5 --algo.num-steps 64 --budget-s 600
    gmi-drl train ppo --config tune/Hopper-v5-ppo/tuned.json --total-timesteps 1000000
    gmi-drl eval runs/Hopper-v5-ppo-20260101-120000 --episodes 10 --video
    gmi-drl train ppo --seeds 1-5 --budget.threads-pct 20 [--placement ray]
    gmi-drl eval runs/CartPole-v1-ppo-runs-20260101-120000 --episodes 10
    gmi-drl switch serve --bind 127.0.0.1:9999 [--parent HOST:PORT] [--threshold H]
    gmi-drl bench NAME [benchmark flags]     (gmi-drl bench --help: the names)
    gmi-drl profile report runs/Hopper-v5-ppo-20260101-120000

An expected failure (a GMI or env worker that dies, a checkpoint that does not load, a switch
that does not answer, an invalid config) prints what happened and the next command; the
traceback goes to the run's ``train.log``, or also to the terminal with ``--debug``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from gmi_drl.interrupts import noting_interrupts

USAGE = """usage: gmi-drl {train,tune,eval,switch,bench,profile} ...

  gmi-drl train ALGO [--preset NAME] [--env.task-id ID] [--resume RUN_DIR] [flags]
      (ALGO: ppo a2c dqn ddpg td3 sac in holistic GMIs; appo a3c in serving + trainer GMIs)
  gmi-drl train ppo --gmi.num-gmis N --placement ray [--ray.address auto|HOST:PORT] [flags]
  gmi-drl train ALGO --config tuned.json [flags]   (a run's config.json works too)
  gmi-drl train ALGO --seeds 1-5 [--sweep FLAG=V1,V2 ...] [--budget.threads-pct P]
      [--budget.mem-mib M] [--budget.cores K] [--placement ray] [flags]   (every run a GMI)
  gmi-drl tune [--algo ppo] --env.task-id ID [--budget-s S] [--max-gmis G] [training flags]
      (GMI-DRL Algorithm 2: num_envs and GMIs per device from short real runs -> tuned.json)
  gmi-drl eval RUN_DIR_OR_CHECKPOINT [--episodes 10] [--video]
  gmi-drl eval SWEEP_PARENT [--episodes 10] [--budget.* ...] [--placement ray]   (eval.md)
  gmi-drl switch serve --bind ADDR:PORT [--parent HOST:PORT] [--threshold H] [...]
  gmi-drl bench {env,engines,faces,train,algos,update,grad-step,reduce,switch,switch-training,
                 gmi,async,gpu-sim,learning,profile,tune,probe-noise,launch,checkouts,runs,
                 offpolicy} [flags]
      (the scripts of benchmarks/; gmi-drl bench NAME --help: a script's flags)
  gmi-drl profile report RUN_DIR      (merged timeline, phase breakdown, GPU utilisation)

  --debug (anywhere): tracebacks of expected failures on the terminal too (they always go to
  RUN_DIR/train.log), and gmi-drl's debug log

'gmi-drl train ppo --help' lists every training flag."""


@dataclass
class EvalArgs:
    """Evaluate a checkpoint: mean and std of the episode return; or every run of a sweep's
    parent directory (gmi-drl train ALGO --seeds ...) as serving GMIs: PARENT/eval.md."""

    path: Annotated[str, tyro.conf.Positional]
    """run directory (its newest checkpoint that loads), a checkpoint file, or a sweep's parent
    directory (every run in it)"""
    episodes: int = 10
    """episodes to run"""
    deterministic: bool = True
    """act with the policy's mode (Gaussian mean / arg-max) instead of sampling"""
    num_envs: int = 4
    """envs stepped together"""
    seed: int = 10_000
    """env seed (env i gets seed + i)"""
    video: bool = False
    """also render one episode to eval.mp4 / eval.gif in the run directory, if the task renders"""
    placement: Literal["local", "ray"] = "local"
    """a sweep's parent: where its serving GMIs run (this machine, or the Ray cluster of
    --ray.address)"""


@functools.cache
def _with_budget(base: type | None, name: str) -> type:
    """``base`` (``None``: no fields) with ``budget`` (`gmi_drl.gmi.budget.Budget`: each GMI's
    budget, ``--budget.*``) and, for eval, ``ray`` (the cluster of ``--placement ray``): made at
    first use, since their types import the config package, which ``gmi-drl --help`` needs
    not."""
    from gmi_drl.config import RayConfig
    from gmi_drl.gmi.budget import Budget

    fields = [("budget", Budget, dataclasses.field(default_factory=Budget))]
    if base is not None:
        fields.append(("ray", RayConfig, dataclasses.field(default_factory=RayConfig)))
    cls = dataclasses.make_dataclass(name, fields, bases=(base,) if base else ())
    cls.__doc__ = base.__doc__ if base else "Flags of gmi-drl train ALGO --seeds."
    return cls


@dataclass
class ReportArgs:
    """Merge a run's per-GMI timelines into one Perfetto trace and write the phase breakdown and
    GPU-utilisation plots into RUN_DIR/profile/."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory"""


def _flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``--flag VALUE`` or ``--flag=VALUE`` in ``args`` (last one wins)."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


_BATCHES = """

Runs as GMIs: --seeds 1-5 [--sweep FLAG=V1,V2 ...] [--budget.threads-pct P] [--budget.mem-mib M]
[--budget.cores K] start every run of the grid and seeds as an independent GMI under one parent
directory (docs/usage.md, `--seeds`); every flag below applies to each run."""


def _train_config(algo: str, rest: list[str], prog: str = "gmi-drl train",
                  validated: bool = True):
    """The `TrainConfig` of ``gmi-drl train ALGO REST``: defaults from ``--resume``'s run,
    ``--config``'s file or the preset, then the flags; validated unless ``validated`` is False
    (``gmi-drl train``, where `train` validates it: `_explained` then says where a field that
    does not hold came from). Returns it with the `Resume` of ``--resume`` (or ``None``).

    Raises:
        ConfigError, CheckpointError, OSError: what the user gave does not hold.
    """
    from gmi_drl.algos import ALGORITHMS
    from gmi_drl.config import ConfigError, InvalidConfig, TrainConfig, load_config_file, preset
    from gmi_drl.config import validate

    resume, config = _flag_value(rest, "--resume"), _flag_value(rest, "--config")
    for flag in ("--preset", "--run-dir", "--config"):
        given = _flag_value(rest, flag) is not None
        if given and resume is not None:
            what = "config" if flag == "--config" else flag[2:].replace("-", " ")
            raise ConfigError(f"{flag} with --resume: a resumed run keeps its own {what}; "
                              f"drop {flag}")
        if given and flag == "--preset" and config is not None:
            raise ConfigError("--preset with --config: both set the defaults; drop one")
    found = None
    if resume is not None:
        from gmi_drl.runner.resume import Resume

        found = Resume.find(resume)
        default = found.config()
        if default.algo_name != algo:
            if found.stored.algo_name == algo:
                raise ConfigError(f"{found.run_dir / 'config.json'} configures "
                                  f"{default.algo_name}, but the checkpoint in {resume} is a "
                                  f"{algo} run: restore config.json, or delete it and the "
                                  "checkpoint's copy is used")
            raise ConfigError(f"{resume} is a {default.algo_name} run, not {algo}: run "
                              f"{prog} {default.algo_name} --resume {resume}")
    elif config is not None:
        default = load_config_file(config)
        if default.algo_name != algo:
            raise ConfigError(f"--config {config} configures {default.algo_name}, not {algo}: "
                              f"run {prog} {default.algo_name} --config {config}")
    else:
        default = preset(_flag_value(rest, "--preset") or "auto",
                         _flag_value(rest, "--env.task-id"), algo)
    one = _one_algorithm(ALGORITHMS[algo][0], algo)
    parsed = tyro.cli(one, args=rest, default=one(**_fields(default)), prog=f"{prog} {algo}",
                      description=(TrainConfig.__doc__ or "") + (
                          _BATCHES if prog == "gmi-drl train" else ""))
    cfg = TrainConfig(**_fields(parsed))
    if resume is None and config is None:  # (the preset's own name: gmi-humanoid-sac's is
        cfg.preset = default.preset        # gmi-humanoid)
    if validated:
        try:
            validate(cfg)
        except InvalidConfig as e:
            raise _explained(e, config, found) from None
    if config is not None and cfg.env.task_id != default.env.task_id:
        logging.getLogger(__name__).warning(
            "--config %s was made for %s, not %s: its num_envs, GMIs and hyper-parameters are "
            "kept (a tuned.json's search measured %s; `gmi-drl tune` measures %s)", config,
            default.env.task_id, cfg.env.task_id, default.env.task_id, cfg.env.task_id)
    return cfg, found


def _explained(e, config: str | None, resume):
    """`validate`'s error ``e`` with where the defaults came from, where that may be the cause:
    ``--config``'s file, or a resumed run's ``config.json`` that differs from its checkpoint's
    config (``resume``: the `Resume`)."""
    from gmi_drl.config import ConfigError

    if config is not None:
        return ConfigError(f"{e}\n  (the defaults came from --config {config}; a flag given "
                           "after it overrides a field)")
    edited = resume.edited_config_json() if resume is not None else None
    if edited is not None:
        return ConfigError(f"{e}\n  (with no such flag given: {edited} differs from the "
                           "checkpoint's own config; restore it, or delete it and the "
                           "checkpoint's copy is used)")
    return e


@functools.cache
def _one_algorithm(algo_cls: type, algo: str) -> type:
    """`TrainConfig` with ``algo`` typed as ``algo_cls`` alone, for tyro: parsed against one
    algorithm, a mistyped flag is matched with that algorithm's flags only, and the help names
    ``gmi-drl train ALGO`` (not the subcommand union's every algorithm, without ``train``) and
    the presets of ``algo``."""
    from typing import Annotated

    from gmi_drl.config import PRESETS, TrainConfig

    presets = ", ".join(["auto", *PRESETS[algo]])
    preset_help = (f"preset the defaults came from: {presets} (auto: a warp task's gmi-* "
                   "preset, else by task family); set on the command line only")
    one = dataclasses.make_dataclass(
        "TrainConfig", [("algo", algo_cls, dataclasses.field(default_factory=algo_cls)),
                        ("preset", Annotated[str, tyro.conf.arg(help=preset_help)], "auto")],
        bases=(TrainConfig,))
    one.__doc__ = TrainConfig.__doc__
    return one


def _fields(cfg) -> dict:
    """A `TrainConfig`'s fields by name (not copied): to move it to or from `_one_algorithm`."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (the terminal closed) to ``gmi-drl train``: stops the run as Ctrl-C
    does (its GMIs, a resume hint)."""


_sigterm = threading.Event()  # set by `_terminated`: some libraries (Ray's wait) raise a
# KeyboardInterrupt of their own in place of the handler's `Terminated`
_stop_signal = [signal.SIGTERM]  # which one it was (the exit status says)


def _terminated(signum, frame) -> None:
    _stop_signal[0] = signum
    _sigterm.set()
    raise Terminated()


def _stop_status(e: BaseException | None) -> int:
    """The exit status of a run stopped by ``e``: 128 + the signal after SIGTERM (143) or
    SIGHUP (129), 130 after Ctrl-C, else 1."""
    if isinstance(e, Terminated) or (isinstance(e, KeyboardInterrupt) and _sigterm.is_set()):
        return 128 + _stop_signal[0]
    return 130 if isinstance(e, KeyboardInterrupt) else 1


@contextlib.contextmanager
def _stop_signals_as_ctrl_c():
    """Inside the block, SIGTERM (timeout, systemd) and SIGHUP (a closed terminal or SSH
    session) stop the run as Ctrl-C does (in the main thread; elsewhere the block runs as it
    is); the handlers are restored after it. A SIGHUP already ignored (``nohup``) stays
    ignored. multiprocessing's resource tracker, started here if it
    is not running, ignores SIGHUP for good (an ignored signal stays so across its exec), so
    that a hangup to the whole process group cannot kill it before the run has unlinked its
    shared memory; the GMIs and the fork server ignore it too (`gmi_drl.gmi.launcher`)."""
    from multiprocessing import resource_tracker

    from gmi_drl.gmi.launcher import signals_ignored

    _sigterm.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with signals_ignored(signal.SIGHUP):
        resource_tracker.ensure_running()
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminated)}
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _terminated)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _train(args: list[str], debug: bool = False) -> int:
    from gmi_drl.algos import ALGORITHMS
    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.config import ConfigError, InvalidConfig
    from gmi_drl.runner.run import RunStopped
    from gmi_drl.telemetry.progress import ProgressPrinter
    from gmi_drl.train import train

    if args[:1] in (["-h"], ["--help"]):
        print(f"usage: gmi-drl train ALGO [flags]   (ALGO: {' '.join(ALGORITHMS)})\n"
              "'gmi-drl train ALGO --help' lists the flags of ALGO")
        return 0
    if not args or args[0] not in ALGORITHMS:
        print(f"gmi-drl train: first argument must be an algorithm, one of {list(ALGORITHMS)}",
              file=sys.stderr)
        return 2
    runs, rest = _split_flags(args[1:], {"--seeds", "--sweep"})
    if runs:
        return _train_runs(args[0], runs, rest, debug)
    budget = next((a for a in rest if a.startswith("--budget.")), None)
    if budget is not None:
        print(f"gmi-drl train: {budget.split('=')[0]} is a budget of each run of a batch: give "
              "--seeds (and --sweep) with it; one run's GMIs are planned by --gmi.*",
              file=sys.stderr)
        return 2
    try:
        cfg, resume = _train_config(args[0], args[1:], validated=False)
    except (ConfigError, CheckpointError, OSError) as e:
        print(f"gmi-drl train: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        with _stop_signals_as_ctrl_c():
            result = train(cfg, on_progress=ProgressPrinter(), resume=resume)
    except InvalidConfig as e:
        print(f"gmi-drl train: {_explained(e, _flag_value(args[1:], '--config'), resume)}",
              file=sys.stderr)
        return 2
    except (ConfigError, CheckpointError) as e:
        print(f"gmi-drl train: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:
        if debug:
            traceback.print_exception(e.__cause__, file=sys.stderr)
        print(f"gmi-drl train: {e.reason}\n  {e.next_step}   (traceback: {e.log_path})",
              file=sys.stderr)
        return _stop_status(e.__cause__)
    curve = result.episode_returns[-20:]
    final = f"{curve.mean():.1f}" if len(curve) else "n/a"
    print(f"done: {result.global_step:,} steps in {time.perf_counter() - start:.1f} s, "
          f"final return (last 20 episodes) {final}; run dir {result.run_dir}")
    return 0


def _train_runs(algo: str, flags: list[str], rest: list[str], debug: bool) -> int:
    """``gmi-drl train ALGO --seeds S [--sweep FLAG=V1,V2 ...] REST``: every run of the grid
    and seeds as a GMI (`gmi_drl.sweep`), each config validated, each grid point's algorithm
    built once on its task (`preflight`) and the runs' replays checked together against their
    devices' memory, before any run starts."""
    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.config import ConfigError
    from gmi_drl.runner.preflight import preflight
    from gmi_drl.sweep import (PlannedRun, check_runs, grid_points, parse_seeds, parse_sweep,
                               train_runs)

    seeds, sweeps, i = "0", [], 0
    while i < len(flags):
        flag, eq, value = flags[i].partition("=")
        if not eq:
            value, i = (flags[i + 1] if i + 1 < len(flags) else ""), i + 1
        i += 1
        if flag == "--seeds":
            seeds = value
        else:
            sweeps.append(value)
    _, rest = _split_flags(rest, {"--seed", "--run-dir"})  # (each run gets its own)
    parent_dir = _flag_value(_, "--run-dir")
    budget_flags, rest = _split_flags(rest, {"--budget." + f.replace("_", "-")
                                             for f in ("threads_pct", "mem_mib", "cores")})
    options = tyro.cli(_with_budget(None, "RunsArgs"), args=budget_flags,
                       prog=f"gmi-drl train {algo} --seeds")
    try:
        if _flag_value(rest, "--resume") is not None:
            raise ConfigError("--seeds and --sweep start fresh runs: resume one run of a batch "
                              f"alone, gmi-drl train {algo} --resume PARENT/RUN")
        seed_list, grid = parse_seeds(seeds), parse_sweep(sweeps)
        base, _ = _train_config(algo, rest)
        parent = Path(parent_dir or f"runs/{base.env.task_id.replace('/', '_')}-{algo}-"
                      f"runs-{time.strftime('%Y%m%d-%H%M%S')}")
        planned = []
        for point, point_flags in grid_points(grid):
            for seed in seed_list:
                run = PlannedRun(point, seed, base)
                where = parent / run.name
                try:
                    cfg, _ = _train_config(algo, rest + point_flags + [
                        "--seed", str(seed), "--run-dir", str(where)])
                except (ConfigError, CheckpointError, OSError) as e:
                    raise ConfigError(f"run {run.name}: {e}") from None
                except SystemExit:  # (tyro printed what does not parse)
                    raise ConfigError(f"run {run.name}: its flags do not parse (above); no run "
                                      "started") from None
                planned.append(PlannedRun(point, seed, cfg))
            try:  # what only the task tells (an action space, a replay's size): once a point
                preflight(planned[-1].cfg)
            except ConfigError as e:
                raise ConfigError(f"run {planned[-1].name}: {e}") from None
        check_runs(planned)
        print(f"{len(planned)} runs as GMIs under {parent}", flush=True)
        with _stop_signals_as_ctrl_c():
            outcomes, wall = train_runs(planned, parent, options.budget)
    except (ConfigError, CheckpointError, OSError) as e:
        print(f"gmi-drl train: {e}", file=sys.stderr)
        return 2
    failed = [o for o in outcomes if o.error]
    for o in failed:
        print(f"gmi-drl train: run {o.name} stopped: {o.error}", file=sys.stderr)
    print(f"done: {len(outcomes) - len(failed)} of {len(outcomes)} runs in {wall:.1f} s; "
          f"summary {parent / 'summary.md'}")
    return 1 if failed else 0


def _split_flags(args: list[str], names: set[str]) -> tuple[list[str], list[str]]:
    """``args`` split into the flags named in ``names`` (with their values) and the rest."""
    mine, rest, i = [], [], 0
    while i < len(args):
        name = args[i].split("=", 1)[0]
        target = mine if name in names else rest
        target.append(args[i])
        if name in names and "=" not in args[i] and i + 1 < len(args) \
                and not args[i + 1].startswith("--"):
            target.append(args[i + 1])
            i += 1
        i += 1
    return mine, rest


def _tune(args: list[str], debug: bool = False) -> int:
    import dataclasses

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.config import ConfigError
    from gmi_drl.tune import TuneOptions, gmi_role, plan, top_unit, tune
    from gmi_drl.runner.preflight import preflight

    names = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(TuneOptions)}
    names |= {"--no-" + n[2:] for n in names}  # tyro's negated booleans
    mine, rest = _split_flags(args, names | {"--algo"})
    algo = _flag_value(mine, "--algo") or "ppo"
    mine = [a for i, a in enumerate(mine) if not (a.startswith("--algo") or
                                                   (i and mine[i - 1] == "--algo"))]
    if "-h" in rest or "--help" in rest:
        print(TUNE_USAGE)
        tyro.cli(TuneOptions, args=["--help"], prog="gmi-drl tune")
    try:
        options = tyro.cli(TuneOptions, args=mine, prog="gmi-drl tune")
        for flag in ("--resume", "--run-dir"):  # before the config, whose errors would send
            if _flag_value(rest, flag) is not None:  # the user on to use them
                raise ConfigError(f"{flag} is for gmi-drl train: tune measures fresh short runs "
                                  "in scratch directories and writes its files to --out; train "
                                  "the result with gmi-drl train ALGO --config tuned.json")
        cfg, _ = _train_config(algo, rest, prog="gmi-drl tune --algo")
        planned = plan(cfg, options)  # every option and --out, before the table starts
        preflight(cfg)  # an algorithm that cannot run the task fails here, not in every probe
    except (ConfigError, CheckpointError, OSError, ValueError) as e:
        print(f"gmi-drl tune: {e}", file=sys.stderr)
        return 2
    print(f"gmi-drl tune: {cfg.algo_name} on {cfg.env.task_id}, GMI-DRL Algorithm 2 "
          f"(alpha {options.alpha}); each point trains in a process of its own: "
          f"{options.warmup} warm-up iteration(s), then at least {options.iterations} "
          f"measured, {options.min_steps:,} env steps and about {options.min_seconds:g} s")
    role, unit = gmi_role(cfg), top_unit(cfg)
    header = (f"| {role}/device | num_envs | runnable | {unit} | peak mem/GMI | Sat | "
              "estimate | s |")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed} "
                  "points"), TimeElapsedColumn()) as bar:
        task = bar.add_task("profiling", total=None)
        bar.console.print(header + "\n|---|---|---|---|---|---|---|---|", soft_wrap=True)

        def row(p) -> None:
            bar.advance(task)
            bar.update(task, description=f"profiled {p.gmis} {role} x {p.num_envs} envs")
            sat = "" if p.sat is None else f"{p.sat:.3g}"
            est = "" if p.estimate is None else f"{p.estimate:,.0f}"
            ok = "yes" + (" (cached)" if p.cached else "") if p.runnable else f"no: {p.reason}"
            bar.console.print(f"| {p.gmis} | {p.num_envs} | {ok} | {p.top:,.0f} | "
                              f"{p.mem / 2**20:,.0f} MiB | {sat} | {est} | {p.seconds:.1f} |",
                              markup=False, highlight=False, soft_wrap=True)

        try:
            with _stop_signals_as_ctrl_c():  # the probe running is stopped as on Ctrl-C
                report = tune(cfg, options, row, planned=planned)
        except ValueError as e:
            print(f"gmi-drl tune: {e}", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"gmi-drl tune: cannot write the search's files in --out {planned.out}: {e}",
                  file=sys.stderr)
            return 2
    return _print_tune(report, algo, role, unit)


TUNE_USAGE = """usage: gmi-drl tune [--algo ppo] [tune flags] [training flags]

Searches num_envs and GMIs per device for the job the training flags describe (GMI-DRL §5.2,
Algorithm 2) with short real runs, and writes tuned.json for `gmi-drl train ALGO --config`.
Training flags are those of `gmi-drl train ALGO` (e.g. --env.task-id Hopper-v5): `gmi-drl
train ALGO --help` lists them. The tune flags follow."""


def _print_tune(report, algo: str, gmis: str, unit: str) -> int:
    r = report.search
    if r.budget_exhausted:
        print("the --budget-s ran out: the search stopped early")
    if report.chosen is None:
        if r.budget_exhausted and not r.points:
            hint = "raise --budget-s"
        elif r.points and all(p.reason.startswith("hung") for p in r.points):
            hint = "every point ran past --probe-timeout-s: raise it"
        else:
            hint = "see the reasons above, or widen --envs-min/--envs-max"
        print(f"gmi-drl tune: no runnable point ({len(r.points)} profiled); {hint}",
              file=sys.stderr)
        earlier = report.out_dir / "tuned.json"
        if earlier.exists():
            print(f"gmi-drl tune: {earlier} is an earlier search's, left as it was",
                  file=sys.stderr)
        return 1
    c = report.chosen
    print(f"\nchosen ({report.chosen_by}): num_envs {c.num_envs}, {c.gmis} {gmis} per device: "
          f"{c.top:,.0f} {unit} measured; search {report.wall_s:.0f} s, "
          f"{len(r.points)} points ({sum(p.cached for p in r.points)} from the cache)")
    if report.no_model:
        print(f"\ncost model: not predicted: {report.no_model}")
    if report.predictions:
        ref = report.reference
        print(f"\ncost model (GMI-DRL Tables 4-5, eqs. 2-3) from the terms of 1 GMI alone at "
              f"num_envs {ref.num_envs} (1 GMI: the reference itself):\n")
        print("| GMIs | template | model | predicted env steps/s | measured | error |\n"
              "|---|---|---|---|---|---|")
        for p in report.predictions:
            meas = "not run (no such template)" if p.measured is None else f"{p.measured:,.0f}"
            err = "" if p.error is None else f"{p.error:+.1%}"
            print(f"| {p.gmis} | {p.template} | {p.variant} | {p.predicted:,.0f} | {meas} | "
                  f"{err} |")
    print(f"\nwrote {report.tuned_path}" + (f", {report.plot_path}" if report.plot_path else "")
          + f"\ntrain with it: gmi-drl train {algo} --config {report.tuned_path} [flags]")
    return 0


def _eval(args: list[str], debug: bool = False) -> int:
    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.evaluate import evaluate
    from gmi_drl.serving import find_runs

    a = tyro.cli(_with_budget(EvalArgs, "EvalArgs"), args=args, prog="gmi-drl eval")
    if find_runs(a.path):
        return _eval_runs(a, debug)
    try:
        report = evaluate(a.path, a.episodes, a.deterministic, a.seed, a.num_envs, a.video)
    except (CheckpointError, ValueError) as e:
        if debug:
            traceback.print_exc()
        print(f"gmi-drl eval: {e}", file=sys.stderr)
        return 2
    r = report.returns
    print(f"{a.path}: return {r.mean():.2f} +/- {r.std():.2f} over {len(r)} episodes "
          f"(min {r.min():.2f}, max {r.max():.2f}, mean length {report.lengths.mean():.1f})")
    if report.video_path is not None:
        print(f"video: {report.video_path}")
    return 0


def _eval_runs(a, debug: bool) -> int:
    """``gmi-drl eval PARENT``: every run of a sweep's parent directory as a serving GMI
    (`gmi_drl.serving`); the table on stdout and in PARENT/eval.md."""
    from gmi_drl.config import ConfigError
    from gmi_drl.serving import ServingSpec, eval_runs, find_runs

    runs = find_runs(a.path)
    try:
        if a.video:
            raise ConfigError("--video records one run's episode: give that run's directory "
                              f"(e.g. {runs[0].run_dir}), not the sweep's parent")
        if a.episodes < 1 or a.num_envs < 1 or not 0 <= a.seed < 2**31:
            raise ConfigError(f"--episodes {a.episodes} and --num-envs {a.num_envs} must be >= 1"
                              f", --seed {a.seed} in [0, 2**31)")
        spec = ServingSpec(tuple(runs), a.episodes, a.deterministic, a.seed, a.num_envs)
        print(f"{len(runs)} runs of {a.path} as serving GMIs", flush=True)
        with _stop_signals_as_ctrl_c():
            outcomes, text = eval_runs(a.path, spec, a.budget, a.placement, a.ray)
    except (ConfigError, OSError) as e:
        if debug:
            traceback.print_exc()
        print(f"gmi-drl eval: {e}", file=sys.stderr)
        return 2
    print(text)
    failed = [o for o in outcomes if o.error]
    for o in failed:
        print(f"gmi-drl eval: run {o.name} not evaluated: {o.error}", file=sys.stderr)
    print(f"wrote {Path(a.path) / 'eval.md'}")
    return 1 if failed else 0


def _profile(args: list[str], debug: bool = False) -> int:
    from gmi_drl.telemetry.report import write_report

    if args[:1] in (["-h"], ["--help"]):
        print("usage: gmi-drl profile report RUN_DIR   (merges the run's per-GMI timelines into "
              "one Perfetto trace and writes the phase breakdown into RUN_DIR/profile/)\n"
              "'gmi-drl profile report --help' lists its flags")
        return 0
    if not args or args[0] != "report":
        print("gmi-drl profile: first argument must be 'report' (gmi-drl profile report RUN_DIR)",
              file=sys.stderr)
        return 2
    a = tyro.cli(ReportArgs, args=args[1:], prog="gmi-drl profile report")
    try:
        files = write_report(a.run_dir)
    except (OSError, ValueError) as e:  # (an OSError's str names the path)
        if debug:
            traceback.print_exc()
        print(f"gmi-drl profile report: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {p}" for p in files if p is not None))
    return 0


def _switch(args: list[str], debug: bool = False) -> int:
    from gmi_drl.comm.switch.cli import main as switch_main

    return switch_main(args)


BENCHMARKS = {"env": "env_throughput", "engines": "mujoco_engines", "faces": "faces",
              "train": "train_throughput", "algos": "algo_throughput", "update": "ppo_update",
              "grad-step": "grad_step", "reduce": "reduce", "switch": "switch",
              "switch-training": "switch_training", "gmi": "gmi_scaling",
              "async": "async_training", "gpu-sim": "gpu_sim", "learning": "learning",
              "profile": "profile_overhead", "tune": "tune", "probe-noise": "probe_noise",
              "launch": "launch", "checkouts": "checkouts", "runs": "runs",
              "offpolicy": "offpolicy_gpu"}


def _bench(args: list[str], debug: bool = False) -> int:
    import runpy

    from gmi_drl.config import ConfigError

    listing = "\n".join(f"  {name:<16} benchmarks/{script}.py"
                        for name, script in BENCHMARKS.items())
    if args[:1] in (["-h"], ["--help"]):
        print(f"usage: gmi-drl bench NAME [flags]   (gmi-drl bench NAME --help: its flags)\n"
              f"{listing}")
        return 0
    if not args or args[0] not in BENCHMARKS:
        print(f"gmi-drl bench: first argument must be one of {list(BENCHMARKS)}", file=sys.stderr)
        return 2
    script = Path(__file__).resolve().parent.parent / "benchmarks" / f"{BENCHMARKS[args[0]]}.py"
    if not script.exists():
        print(f"gmi-drl bench: {script} not found; benchmarks run from a source checkout "
              "(pip install -e .)", file=sys.stderr)
        return 2
    repeats = _flag_value(args, "--repeats")
    if repeats is not None and not (repeats.isdigit() and int(repeats) >= 1):
        print(f"gmi-drl bench {args[0]}: --repeats {repeats} must be an int >= 1 (each figure is "
              "a median over the repeats)", file=sys.stderr)
        return 2
    argv, sys.argv = sys.argv, [str(script), *args[1:]]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ValueError as e:  # a task, size or config the benchmark cannot run (ConfigError too)
        if debug:
            traceback.print_exc()
        kind = "" if isinstance(e, ConfigError) else f"{type(e).__name__}: "
        print(f"gmi-drl bench {args[0]}: {kind}{e}" + ("" if debug else "   (--debug: the "
              "traceback)"), file=sys.stderr)
        return 2
    finally:
        sys.argv = argv
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gmi-drl`` script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    _sigterm.clear()
    try:  # noted from here: a Ctrl-C inside the imports below is raised where a run starts
        with noting_interrupts():
            return _command(argv, debug)
    except KeyboardInterrupt:  # before a run started (imports, set-up): nothing to clean up
        if debug:
            traceback.print_exc()
        print(f"gmi-drl {argv[0] if argv else ''}: interrupted", file=sys.stderr)
        return _stop_status(sys.exc_info()[1])


def _command(argv: list[str], debug: bool) -> int:
    """Logging set up, then the command ``argv[0]`` run with ``argv[1:]``."""
    # gmi-drl's own messages from INFO up; other libraries' only from WARNING up (matplotlib's
    # "generated new fontManager", Ray's and torch's INFO lines are not the user's business)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("gmi_drl").setLevel(logging.DEBUG if debug else logging.INFO)
    if not debug:  # tracebacks logged for train.log stay off the terminal
        from gmi_drl.errors import terminal_filter

        for handler in logging.getLogger().handlers:
            if terminal_filter not in handler.filters:
                handler.addFilter(terminal_filter)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    commands = {"train": _train, "tune": _tune, "eval": _eval, "switch": _switch, "bench": _bench,
                "profile": _profile}
    if argv[0] not in commands:
        print(f"gmi-drl: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if argv[0] in ("train", "tune"):  # (eval --video renders: it keeps MuJoCo's default)
        from gmi_drl.gmi.launcher import NO_RENDERING

        os.environ.setdefault("MUJOCO_GL", NO_RENDERING)
    return commands[argv[0]](argv[1:], debug)


if __name__ == "__main__":
    sys.exit(main())
