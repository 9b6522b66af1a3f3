"""A sweep's runs evaluated as serving GMIs: ``gmi-drl eval PARENT_DIR`` over the parent
directory of ``gmi-drl train ALGO --seeds ...`` (`gmi_drl.sweep`).

Every run's checkpoint is evaluated (`gmi_drl.evaluate.evaluate`) in a GMI of the ``serving``
template (GMI-DRL §5.1, Fig. 6: TCG, simulator and agent in one GMI, no traffic between GMIs),
the GMIs planned and budgeted by the planner of the sweep's runs (`gmi_drl.gmi.budget.plan_runs`;
CPU core sets, since the evaluation acts on the CPU) and started on this machine or over a Ray
cluster. The table (``PARENT/eval.md``) gives each run's
mean return over its episodes, and per configuration the mean, IQM and 95% bootstrap confidence
interval of those over seeds (Agarwal et al. 2021; `gmi_drl.sweep.aggregate`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gmi_drl.config import RayConfig
from gmi_drl.gmi.budget import Budget, plan_runs
from gmi_drl.gmi.budget import describe as describe_budget
from gmi_drl.gmi.layout import Template
from gmi_drl.sweep import launch_runs, seed_rows

TARGET = "gmi_drl.serving:serve_gmi"
_SEED_DIR = re.compile(r"^seed-(\d+)$")


@dataclass(frozen=True)
class ServedRun:
    """One run of a sweep: its configuration (``""``: the command without a grid), seed and
    run directory."""

    point: str
    seed: int
    run_dir: str

    @property
    def name(self) -> str:
        return f"{self.point}/seed-{self.seed}" if self.point else f"seed-{self.seed}"


@dataclass(frozen=True)
class ServingSpec:
    """The payload of every serving GMI: the runs by GMI id and the evaluation's settings
    (`gmi_drl.evaluate.evaluate`'s arguments)."""

    runs: tuple[ServedRun, ...]
    episodes: int = 10
    deterministic: bool = True
    seed: int = 10_000
    num_envs: int = 4


@dataclass(frozen=True)
class EvalOutcome:
    """What one serving GMI returns."""

    name: str
    run_dir: str
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """``(episodes,) float64`` undiscounted returns"""
    lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """``(episodes,) int64``"""
    error: str = ""
    """why the run could not be evaluated, or ``""``"""

    @property
    def mean(self) -> float:
        return float(self.returns.mean()) if len(self.returns) else float("nan")


def find_runs(parent: str | Path) -> list[ServedRun]:
    """The runs of a sweep's parent directory: ``PARENT/seed-K`` and ``PARENT/POINT/seed-K``
    directories, by configuration, then seed, each run directory absolute (a Ray worker's
    working directory is not the driver's); ``[]``: not a sweep's parent (a run directory,
    which has ``checkpoints/`` of its own, is not one)."""
    parent = Path(parent)
    if not parent.is_dir() or (parent / "checkpoints").is_dir():
        return []
    runs = []
    for d in [*parent.glob("seed-*"), *parent.glob("*/seed-*")]:
        m = _SEED_DIR.match(d.name)
        if m and d.is_dir():
            point = "" if d.parent == parent else d.parent.name
            runs.append(ServedRun(point, int(m[1]), str(d.resolve())))
    return sorted(runs, key=lambda r: (r.point, r.seed))


def serve_gmi(ctx) -> EvalOutcome:
    """Serving GMI ``ctx.gmi_id``: evaluate its run's newest checkpoint that loads. A checkpoint
    that does not load returns its reason; the other GMIs go on."""
    from gmi_drl.checkpoint import CheckpointError
    from gmi_drl.evaluate import evaluate

    spec = ctx.payload
    run = spec.runs[ctx.gmi_id]
    try:
        r = evaluate(run.run_dir, spec.episodes, spec.deterministic, spec.seed, spec.num_envs)
    except CheckpointError as e:
        return EvalOutcome(run.name, run.run_dir, error=str(e))
    return EvalOutcome(run.name, run.run_dir, r.returns, r.lengths)


def eval_runs(parent: str | Path, spec: ServingSpec, budget: Budget = Budget(),
              placement: str = "local", ray: RayConfig = RayConfig()
              ) -> tuple[list[EvalOutcome], str]:
    """Evaluate every run of ``spec`` (`find_runs` of ``parent``) in a serving GMI of its own
    (blocks); writes ``parent/eval.md`` and returns the outcomes (a GMI that died: an outcome
    with its error) with the table. The serving GMIs are CPU core sets on any machine:
    `gmi_drl.evaluate` builds the policy and steps the task on the CPU.

    Raises:
        ConfigError: a budget that does not fit this machine (or an MPS budget), before any GMI
            starts; a Ray cluster that cannot place them.
    """
    from gmi_drl.gmi.devices import discover

    machine = discover()
    layout = dataclasses.replace(
        plan_runs(len(spec.runs), machine, Template.SERVING, budget, "cpu"),
        backend_reason="the evaluation acts on the CPU (gmi_drl.evaluate): GMIs are CPU core sets")
    t0 = time.perf_counter()
    results, where = launch_runs(TARGET, layout, machine, spec, placement, ray)
    wall = time.perf_counter() - t0
    outcomes = [r if isinstance(r, EvalOutcome) else
                EvalOutcome(run.name, run.run_dir, error=r or "its GMI died (see the log)")
                for run, r in zip(spec.runs, results)]
    text = table(spec, outcomes, wall, layout.describe(reduction=False)
                 + describe_budget(layout, machine) + where)
    (Path(parent) / "eval.md").write_text(text)
    return outcomes, text


def table(spec: ServingSpec, outcomes: list[EvalOutcome], wall_s: float, layout_text: str) -> str:
    """``eval.md``: per configuration the aggregate over seeds of each run's mean return, then
    every run, then how the serving GMIs were placed."""
    how = "deterministic" if spec.deterministic else "sampled"
    lines = [f"# Evaluation of {len(outcomes)} runs as serving GMIs", "",
             f"Each run's newest checkpoint that loads, {spec.episodes} episodes ({how} actions, "
             f"env seed {spec.seed}); over seeds the mean of the runs' mean returns, their "
             "interquartile mean (IQM) and its 95% percentile-bootstrap confidence interval "
             f"(Agarwal et al. 2021). {wall_s:.1f} s.", ""]
    lines += seed_rows(spec.runs, outcomes, lambda o: o.mean)
    lines += ["", "| run | mean return | std | episodes | mean length | run dir |",
              "|---|---:|---:|---:|---:|---|"]
    for o in outcomes:
        if o.error:
            lines.append(f"| {o.name} | failed: {o.error} | | | | {o.run_dir} |")
        else:
            lines.append(f"| {o.name} | {o.mean:.1f} | {o.returns.std():.1f} | "
                         f"{len(o.returns)} | {o.lengths.mean():.1f} | {o.run_dir} |")
    lines += ["", "## Placement", "", "- one serving GMI per run, no traffic between them",
              layout_text.rstrip()]
    return "\n".join(lines) + "\n"
