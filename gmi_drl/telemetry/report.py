"""``gmi-drl profile report RUN_DIR``: one merged timeline, a phase breakdown, GPU utilisation.

Reads ``RUN_DIR/timeline.json`` (GMI 0), ``RUN_DIR/gmi-<k>/timeline.json`` (GMI k) and
``RUN_DIR/gpu_util.csv``; writes into ``RUN_DIR/profile/``:

- ``trace.json``: every GMI's timeline in one Chrome-trace file (open in https://ui.perfetto.dev),
  one named process track per GMI, times aligned through each file's Unix clock anchor and
  counted from the run's first event; NVML GPU utilisation as counter tracks.
- ``phase_breakdown.csv`` / ``.png``: per GMI and iteration, the split of iSwitch's Fig. 4
  (the iSwitch paper §2.2): *computation* (local gradient computation: agent
  inference, env steps, GAE, minibatch sampling, forward and backward passes) = ``rollout`` +
  ``advantages`` + ``update`` less the two below; *aggregation* = ``update/allreduce``; *weight
  update* = ``update/optimizer`` (with one trainer and a compiled step, the optimizer runs inside
  ``update/compiled_step`` and counts as computation); *other* = the rest of the iteration
  (log, checkpoint).
- ``gpu_util.png``: utilisation of every GPU over the run (GMI-DRL's Fig. 1b), where NVML saw
  GPUs while it trained.
- ``report.md``: the tables, the plots, and the tool reports found in ``profile/``.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gmi_drl.files import write_text_atomically

AGGREGATION = ("update/allreduce", "learn/allreduce")
WEIGHT_UPDATE = ("update/optimizer", "learn/optimizer")
COMPUTATION_ROOTS = ("rollout", "advantages", "update", "learn", "inference", "env_step")
"""top-level phases whose time, less aggregation and weight update, is computation: the sync
loop's, and an async trainer GMI's ``learn`` with, in a serial async run, the serving role's
``inference`` and ``env_step`` (waiting for a batch, publishing and fetching weights and
dispensing fragments are *other*)"""
PHASES = ("rollout", "rollout/env_step", "rollout/inference", "advantages", "update",
          "update/forward", "update/backward", "update/compiled_grad", "update/compiled_step",
          "update/allreduce", "update/optimizer",
          "batch", "weights", "inference", "env_step", "dispense", "learn", "learn/forward",
          "learn/backward", "learn/compiled_grad", "learn/compiled_step", "learn/allreduce",
          "learn/optimizer", "publish", "log", "checkpoint")
"""the order of the per-phase table and CSV columns (sync loop, then async roles); a run's
report lists the phases its iterations have, any others after these"""
GPU_PID = 1_000_000
"""process id of the NVML counter tracks in the merged trace (GMIs use their ids)"""


@dataclass
class GmiTimeline:
    """One GMI's ``timeline.json``: its id, file and parsed document."""

    gmi_id: int
    path: Path
    doc: dict


class IterationBreakdown(NamedTuple):
    """One iteration of one GMI, in seconds (iSwitch Fig. 4 categories; see the module doc)."""

    gmi_id: int
    iteration: int
    wall_s: float
    computation_s: float
    aggregation_s: float
    weight_update_s: float
    other_s: float
    phases_s: dict[str, float]
    """seconds per section path (``"rollout/env_step"`` ...)"""


class ReportFiles(NamedTuple):
    """What `write_report` wrote (a plot is ``None`` when there was nothing to plot: no
    iteration records, no GPU samples)."""

    trace: Path
    markdown: Path
    breakdown_csv: Path
    breakdown_plot: Path | None
    gpu_plot: Path | None


def load_timelines(run_dir: str | Path) -> list[GmiTimeline]:
    """The run's timelines ordered by GMI id.

    Raises:
        FileNotFoundError: ``run_dir`` holds no ``timeline.json`` (not a run directory, or the run
            has not finished a process yet).
        ValueError: a timeline that is not a Chrome-trace JSON document.
    """
    run_dir = Path(run_dir)
    paths = {0: run_dir / "timeline.json"}
    for p in run_dir.glob("gmi-*/timeline.json"):
        m = re.fullmatch(r"gmi-(\d+)", p.parent.name)
        if m:
            paths[int(m[1])] = p
    found = [(k, p) for k, p in sorted(paths.items()) if p.exists()]
    if not found:
        raise FileNotFoundError(f"{run_dir} has no timeline.json (nor gmi-<k>/timeline.json): "
                                "not a gmi-drl run directory, or no process of it has finished")
    out = []
    for k, p in found:
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p} is not valid JSON: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise ValueError(f"{p} is not a Chrome-trace document (no traceEvents list)")
        out.append(GmiTimeline(k, p, doc))
    return out


def _offset_us(t: GmiTimeline) -> float | None:
    clock = t.doc.get("otherData", {}).get("clock")
    if not clock:
        return None
    return float(clock["unix_us"]) - float(clock["perf_counter_us"])


def merge_timelines(timelines: list[GmiTimeline], gpu_csv: Path | None = None) -> dict:
    """One Chrome-trace document holding every GMI's events.

    GMI ``k``'s events get ``pid = k`` and a process track named ``gmi-<k> (<host> pid <pid>)``,
    sorted by id. When every timeline carries a clock anchor, ``ts`` is converted to Unix time
    (so GMIs on different hosts line up, up to their clocks' offset) and then counted from the
    earliest event; otherwise (older files) the raw ``perf_counter`` times are kept, which agree
    only among processes of one host. Rows of ``gpu_csv`` become counter events
    (``util_pct``, ``mem_util_pct``) on process `GPU_PID` when times are aligned.
    Microseconds throughout; ``otherData`` says how times were aligned and ``t0_unix_us``.
    """
    offsets = [_offset_us(t) for t in timelines]
    aligned = all(o is not None for o in offsets)
    events: list[dict] = []
    for t, off in zip(timelines, offsets):
        other = t.doc.get("otherData", {})
        label = f"gmi-{t.gmi_id}"
        if "host" in other:
            label += f" ({other['host']} pid {other.get('pid', '?')})"
        events.append({"name": "process_name", "ph": "M", "pid": t.gmi_id, "tid": 0,
                       "args": {"name": label}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": t.gmi_id, "tid": 0,
                       "args": {"sort_index": t.gmi_id}})
        for e in t.doc["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                continue
            e = dict(e, pid=t.gmi_id)
            if "ts" in e and aligned:
                e["ts"] = e["ts"] + off
            events.append(e)
    timed = [e["ts"] for e in events if "ts" in e]
    t0 = min(timed) if timed else 0.0
    for e in events:
        if "ts" in e:
            e["ts"] = round(e["ts"] - t0, 3)
    if aligned and gpu_csv is not None and gpu_csv.exists():
        events.append({"name": "process_name", "ph": "M", "pid": GPU_PID, "tid": 0,
                       "args": {"name": "GPUs (NVML)"}})
        for row in read_gpu_util(gpu_csv):
            events.append({"name": f"GPU {row['gpu']}", "ph": "C", "pid": GPU_PID, "tid": 0,
                           "ts": round(row["unix_s"] * 1e6 - t0, 3),
                           "args": {"util_pct": row["util_pct"],
                                    "mem_util_pct": row["mem_util_pct"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"gmis": [t.gmi_id for t in timelines],
                          "clock": "unix (per-file anchors)" if aligned else "perf_counter (raw)",
                          "t0_unix_us": t0 if aligned else None}}


def iteration_breakdown(timelines: list[GmiTimeline]) -> list[IterationBreakdown]:
    """Per GMI and iteration, the iSwitch Fig. 4 split of the iteration's wall time (from the
    ``"cat": "iteration"`` events; a timeline without them contributes nothing)."""
    rows = []
    for t in timelines:
        for e in t.doc["traceEvents"]:
            if e.get("cat") != "iteration" or e.get("ph") != "X":
                continue
            ph = {k: float(v) for k, v in e["args"]["phases_s"].items()}
            wall = float(e["dur"]) * 1e-6
            agg = sum(ph.get(p, 0.0) for p in AGGREGATION)
            upd = sum(ph.get(p, 0.0) for p in WEIGHT_UPDATE)
            comp = sum(ph.get(p, 0.0) for p in COMPUTATION_ROOTS) - agg - upd
            rows.append(IterationBreakdown(t.gmi_id, int(e["args"]["iteration"]), wall, comp, agg,
                                           upd, max(wall - comp - agg - upd, 0.0), ph))
    return sorted(rows, key=lambda r: (r.gmi_id, r.iteration))


def read_gpu_util(path: Path) -> list[dict]:
    """Rows of a ``gpu_util.csv`` (`gmi_drl.telemetry.gpu_util`) as dicts of numbers."""
    with open(path, newline="") as f:
        return [{"unix_s": float(r["unix_s"]), "gpu": int(r["gpu"]),
                 "util_pct": float(r["util_pct"]), "mem_util_pct": float(r["mem_util_pct"]),
                 "mem_used_mib": float(r["mem_used_mib"])} for r in csv.DictReader(f)]


def _mean_by_iteration(rows: list[IterationBreakdown]) -> list[tuple[int, list[float]]]:
    """``(iteration, [wall, computation, aggregation, weight update, other])``, means over
    GMIs."""
    by: dict[int, list[IterationBreakdown]] = {}
    for r in rows:
        by.setdefault(r.iteration, []).append(r)
    return [(k, [sum(getattr(r, f) for r in rs) / len(rs) for f in
                 ("wall_s", "computation_s", "aggregation_s", "weight_update_s", "other_s")])
            for k, rs in sorted(by.items())]


def plot_breakdown(rows: list[IterationBreakdown], path: Path) -> None:
    """Stacked bars per iteration (mean over GMIs): milliseconds (top) and share of the
    iteration (bottom) of computation, aggregation, weight update and other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    means = _mean_by_iteration(rows)
    x = [k for k, _ in means]
    names = ("computation", "aggregation", "weight update", "other")
    fig, (ax_ms, ax_pct) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    bottom_ms, bottom_pct = [0.0] * len(x), [0.0] * len(x)
    for i, name in enumerate(names, start=1):
        ms = [v[i] * 1e3 for _, v in means]
        pct = [100.0 * v[i] / v[0] if v[0] > 0 else 0.0 for _, v in means]
        ax_ms.bar(x, ms, bottom=bottom_ms, label=name, width=0.8)
        ax_pct.bar(x, pct, bottom=bottom_pct, width=0.8)
        bottom_ms = [a + b for a, b in zip(bottom_ms, ms)]
        bottom_pct = [a + b for a, b in zip(bottom_pct, pct)]
    ax_ms.set_ylabel("ms per iteration")
    ax_ms.legend(loc="upper right", fontsize=8)
    ax_ms.set_title(f"Phase breakdown per iteration (mean over {len({r.gmi_id for r in rows})} "
                    "GMIs; iSwitch Fig. 4 categories)")
    ax_pct.set_ylabel("% of iteration")
    ax_pct.set_ylim(0, 100)
    ax_pct.set_xlabel("iteration (PPO update)")
    ax_pct.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    for ax in (ax_ms, ax_pct):
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gpu_util(samples: list[dict], path: Path) -> None:
    """Utilisation (%) of every GPU against seconds since the first sample."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(s["unix_s"] for s in samples)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for gpu in sorted({s["gpu"] for s in samples}):
        mine = [s for s in samples if s["gpu"] == gpu]
        ax.plot([s["unix_s"] - t0 for s in mine], [s["util_pct"] for s in mine],
                label=f"GPU {gpu}")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("GPU utilisation (%)")
    ax.set_ylim(0, 100)
    ax.set_title("GPU utilisation over the run (NVML; GMI-DRL Fig. 1b)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _phases_of(rows: list[IterationBreakdown]) -> list[str]:
    """The phase paths the rows have: in `PHASES` order, then any others sorted."""
    seen = {p for r in rows for p in r.phases_s}
    return [p for p in PHASES if p in seen] + sorted(seen - set(PHASES))


def _write_json(path: Path, doc: dict) -> None:
    write_text_atomically(path, json.dumps(doc))


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}" if whole > 0 else "n/a"


def write_report(run_dir: str | Path) -> ReportFiles:
    """Write ``RUN_DIR/profile/{trace.json, phase_breakdown.csv, phase_breakdown.png,
    gpu_util.png, report.md}`` (see the module docstring); returns their paths.

    Raises:
        FileNotFoundError, ValueError: as `load_timelines`.
    """
    run_dir = Path(run_dir)
    timelines = load_timelines(run_dir)
    out = run_dir / "profile"
    out.mkdir(parents=True, exist_ok=True)
    gpu_csv = run_dir / "gpu_util.csv"
    trace = merge_timelines(timelines, gpu_csv)
    trace_path = out / "trace.json"
    _write_json(trace_path, trace)
    rows = iteration_breakdown(timelines)
    phases = _phases_of(rows)

    csv_path = out / "phase_breakdown.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gmi", "iteration", "wall_ms", "computation_ms", "aggregation_ms",
                    "weight_update_ms", "other_ms", *(f"{p}_ms" for p in phases)])
        for r in rows:
            w.writerow([r.gmi_id, r.iteration, *(round(v * 1e3, 3) for v in
                        (r.wall_s, r.computation_s, r.aggregation_s, r.weight_update_s,
                         r.other_s)),
                        *(round(r.phases_s.get(p, 0.0) * 1e3, 3) for p in phases)])
    plot_path = out / "phase_breakdown.png"
    gmis = [t.gmi_id for t in timelines]
    n_events = sum(1 for e in trace["traceEvents"] if e.get("ph") != "M")
    lines = [f"# Profile of `{run_dir.name}`", "",
             f"- merged timeline: `profile/trace.json`: GMIs {gmis}, {n_events:,} events "
             f"(clock: {trace['otherData']['clock']}); open it in https://ui.perfetto.dev",
             "", "## Phase breakdown (iSwitch Fig. 4)", "",
             "computation = rollout + advantages + update (an async trainer's learn, with a "
             "serial async run's inference and env steps), less allreduce and optimizer (agent "
             "inference, env steps, GAE, minibatch sampling, forward, backward); aggregation = "
             "`allreduce`; weight update = `optimizer`; other = the rest of each iteration "
             "(log, checkpoint, an async trainer's wait for a batch and its weight publishing, "
             "and a profiler's own start/stop cost in captured iterations). On a GPU, sections "
             "time the CPU side (kernels run asynchronously). Async serving GMIs have no "
             "iterations: their phases are in the merged timeline.",
             ""]
    if rows:
        plot_breakdown(rows, plot_path)
        lines += ["| GMI | iterations | mean iteration ms | computation % | aggregation % | "
                  "weight update % | other % |", "|---|---:|---:|---:|---:|---:|---:|"]
        for g in gmis:
            mine = [r for r in rows if r.gmi_id == g]
            if not mine:
                continue
            wall = sum(r.wall_s for r in mine)
            lines.append(f"| gmi-{g} | {len(mine)} | {1e3 * wall / len(mine):.2f} | "
                         f"{_pct(sum(r.computation_s for r in mine), wall)} | "
                         f"{_pct(sum(r.aggregation_s for r in mine), wall)} | "
                         f"{_pct(sum(r.weight_update_s for r in mine), wall)} | "
                         f"{_pct(sum(r.other_s for r in mine), wall)} |")
        with_rows = [g for g in gmis if any(r.gmi_id == g for r in rows)]
        lines += ["", "Mean milliseconds per iteration, by phase:", "",
                  "| phase | " + " | ".join(f"gmi-{g}" for g in with_rows) + " |",
                  "|---|" + "---:|" * len(with_rows)]
        for p in phases:
            cells = []
            for g in with_rows:
                mine = [r for r in rows if r.gmi_id == g]
                cells.append(f"{1e3 * sum(r.phases_s.get(p, 0.0) for r in mine) / len(mine):.3f}")
            name = "&nbsp;&nbsp;" * p.count("/") + p.rsplit("/", 1)[-1]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", "![phase breakdown](phase_breakdown.png)", "",
                  "Every iteration of every GMI: `phase_breakdown.csv`.", ""]
    else:
        plot_path.unlink(missing_ok=True)
        lines += ["No iteration records in these timelines (written by a gmi-drl version "
                  "before they were added); the merged trace still shows every phase.", ""]

    lines += ["## GPU utilisation (GMI-DRL Fig. 1b)", ""]
    gpu_plot = None
    samples = read_gpu_util(gpu_csv) if gpu_csv.exists() else []
    if samples:
        gpu_plot = out / "gpu_util.png"
        plot_gpu_util(samples, gpu_plot)
        lines += ["| GPU | samples | mean util % | max util % | max memory used MiB |",
                  "|---|---:|---:|---:|---:|"]
        for gpu in sorted({s["gpu"] for s in samples}):
            mine = [s for s in samples if s["gpu"] == gpu]
            lines.append(f"| {gpu} | {len(mine)} | "
                         f"{sum(s['util_pct'] for s in mine) / len(mine):.1f} | "
                         f"{max(s['util_pct'] for s in mine):.0f} | "
                         f"{max(s['mem_used_mib'] for s in mine):.0f} |")
        lines += ["", "![GPU utilisation](gpu_util.png)", ""]
    else:
        lines += ["No GPU utilisation samples: NVML saw no GPU while this run trained (a CPU "
                  "run), or sampling was off (`--log.gpu-util-interval-s 0`).", ""]

    made = {trace_path, csv_path, plot_path, out / "gpu_util.png", out / "report.md"}
    tools = sorted(p for p in out.rglob("*") if p.is_file() and p not in made)
    lines += ["## Tool reports", ""]
    lines += ([f"- `{p.relative_to(run_dir)}`" for p in tools] or
              ["None: no Nsight Systems or torch profiler output in `profile/` (run with "
               "`--profile.tool nsys|torch`)."])
    md = write_text_atomically(out / "report.md", "\n".join(lines) + "\n")
    return ReportFiles(trace_path, md, csv_path, plot_path if rows else None, gpu_plot)
