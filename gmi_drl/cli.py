"""``gmi-drl``: the command line. The only module that prints.

    gmi-drl train ppo --env.task-id Hopper-v5 --env.num-envs 16 --total-timesteps 1000000 --seed 1
    gmi-drl train ppo --preset demo
    gmi-drl train ppo --resume runs/Hopper-v5-ppo-20260101-120000 --total-timesteps 2000000
    gmi-drl train ppo --gmi.num-gmis 4 --placement ray [--ray.address auto|HOST:PORT]
    gmi-drl eval runs/Hopper-v5-ppo-20260101-120000 --episodes 10 --video
    gmi-drl switch serve --bind 127.0.0.1:9999 [--parent HOST:PORT] [--threshold H]
    gmi-drl bench env|train|algos|update|reduce|switch|gmi|learning|profile [benchmark flags]
    gmi-drl profile report runs/Hopper-v5-ppo-20260101-120000

An expected failure (a GMI or env worker that dies, a checkpoint that does not load, a switch
that does not answer, an invalid config) prints what happened and the next command; the
traceback goes to the run's ``train.log``, or also to the terminal with ``--debug``.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from dataclasses import dataclass
from typing import Annotated

import tyro

USAGE = """usage: gmi-drl {train,eval,switch,bench,profile} ...

  gmi-drl train ALGO [--preset NAME] [--env.task-id ID] [--resume RUN_DIR] [flags]
      (ALGO: ppo a2c dqn ddpg td3 in holistic GMIs; appo a3c in serving + trainer GMIs)
  gmi-drl train ppo --gmi.num-gmis N --placement ray [--ray.address auto|HOST:PORT] [flags]
  gmi-drl eval RUN_DIR_OR_CHECKPOINT [--episodes 10] [--video]
  gmi-drl switch serve --bind ADDR:PORT [--parent HOST:PORT] [--threshold H] [...]
  gmi-drl bench {env,train,algos,update,reduce,switch,gmi,learning,profile} [flags]   (benchmarks/)
  gmi-drl profile report RUN_DIR      (merged timeline, phase breakdown, GPU utilisation)

  --debug (anywhere): tracebacks of expected failures on the terminal too (they always go to
  RUN_DIR/train.log), and gmi-drl's debug log

'gmi-drl train ppo --help' lists every training flag."""


@dataclass
class EvalArgs:
    """Evaluate a checkpoint: mean and std of the episode return."""

    path: Annotated[str, tyro.conf.Positional]
    """run directory (its newest checkpoint that loads) or a checkpoint file"""
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


def _train(args: list[str], debug: bool = False) -> int:
    from gmi_drl.algos import ALGORITHMS
    from gmi_drl.checkpoint import CheckpointError, resolve_checkpoint
    from gmi_drl.config import ConfigError, TrainConfig, from_dict, preset, validate
    from gmi_drl.runner.run import RunStopped
    from gmi_drl.telemetry.progress import ProgressPrinter
    from gmi_drl.train import train

    if not args or args[0] not in ALGORITHMS:
        print(f"gmi-drl train: first argument must be an algorithm, one of {list(ALGORITHMS)}",
              file=sys.stderr)
        return 2
    algo, rest = args[0], args[1:]
    resume = _flag_value(rest, "--resume")
    try:
        if resume is not None:
            ckpt = resolve_checkpoint(resume)
            default = from_dict(json.loads((ckpt.parent.parent / "config.json").read_text()))
            if default.algo_name != algo:
                raise ConfigError(f"{resume} is a {default.algo_name} run, not {algo}")
        else:
            default = preset(_flag_value(rest, "--preset") or "auto",
                             _flag_value(rest, "--env.task-id"), algo)
        # with several algorithms, TrainConfig.algo is a tyro subcommand union
        tyro_args = [algo, *rest] if len(ALGORITHMS) > 1 else rest
        cfg = tyro.cli(TrainConfig, args=tyro_args, default=default,
                       prog=f"gmi-drl train {algo}", description=TrainConfig.__doc__,
                       config=(tyro.conf.CascadeSubcommandArgs,))
        validate(cfg)
    except (ConfigError, CheckpointError, OSError) as e:
        print(f"gmi-drl train: {e}", file=sys.stderr)
        return 2
    try:
        result = train(cfg, on_progress=ProgressPrinter())
    except (ConfigError, CheckpointError) as e:
        print(f"gmi-drl train: {e}", file=sys.stderr)
        return 2
    except RunStopped as e:
        if debug:
            traceback.print_exception(e.__cause__, file=sys.stderr)
        print(f"gmi-drl train: {e.reason}\n  {e.next_step}   (traceback: {e.log_path})",
              file=sys.stderr)
        return 130 if isinstance(e.__cause__, KeyboardInterrupt) else 1
    curve = result.episode_returns[-20:]
    final = f"{curve.mean():.1f}" if len(curve) else "n/a"
    print(f"done: {result.global_step:,} steps in {result.wall_s:.1f} s, "
          f"final return (last 20 episodes) {final}; run dir {result.run_dir}")
    return 0


def _eval(args: list[str], debug: bool = False) -> int:
    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.evaluate import evaluate

    a = tyro.cli(EvalArgs, args=args, prog="gmi-drl eval")
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


def _profile(args: list[str], debug: bool = False) -> int:
    from gmi_drl.telemetry.report import write_report

    if not args or args[0] != "report":
        print("gmi-drl profile: first argument must be 'report' (gmi-drl profile report RUN_DIR)",
              file=sys.stderr)
        return 2
    a = tyro.cli(ReportArgs, args=args[1:], prog="gmi-drl profile report")
    try:
        files = write_report(a.run_dir)
    except (FileNotFoundError, ValueError) as e:
        if debug:
            traceback.print_exc()
        print(f"gmi-drl profile report: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {p}" for p in files if p is not None))
    return 0


def _switch(args: list[str], debug: bool = False) -> int:
    from gmi_drl.comm.switch.cli import main as switch_main

    return switch_main(args)


BENCHMARKS = {"env": "env_throughput", "train": "train_throughput", "algos": "algo_throughput",
              "update": "ppo_update",
              "reduce": "reduce", "switch": "switch", "gmi": "gmi_scaling",
              "learning": "learning", "profile": "profile_overhead"}


def _bench(args: list[str], debug: bool = False) -> int:
    import runpy
    from pathlib import Path

    if not args or args[0] not in BENCHMARKS:
        print(f"gmi-drl bench: first argument must be one of {list(BENCHMARKS)}", file=sys.stderr)
        return 2
    script = Path(__file__).resolve().parent.parent / "benchmarks" / f"{BENCHMARKS[args[0]]}.py"
    if not script.exists():
        print(f"gmi-drl bench: {script} not found; benchmarks run from a source checkout "
              "(pip install -e .)", file=sys.stderr)
        return 2
    sys.argv = [str(script), *args[1:]]
    runpy.run_path(str(script), run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gmi-drl`` script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if debug:
        logging.getLogger("gmi_drl").setLevel(logging.DEBUG)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    commands = {"train": _train, "eval": _eval, "switch": _switch, "bench": _bench,
                "profile": _profile}
    if argv[0] not in commands:
        print(f"gmi-drl: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    return commands[argv[0]](argv[1:], debug)


if __name__ == "__main__":
    sys.exit(main())
