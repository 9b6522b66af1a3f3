"""The run: its directory (resolved once), its frozen config, checkpoints and ``summary.md``.

The controller makes one `Run` per call of `gmi_drl.train.train`; it travels (pickled) to every
GMI, which reads its config and writes through it: GMI 0 the metrics and checkpoints, every GMI
its timeline. Only the controller writes ``config.json`` and ``summary.md``.

Directory layout::

    RUN_DIR/config.json  metrics.csv  events.*  timeline.json  summary.md  learning_curve.png
    RUN_DIR/checkpoints/latest.pt     RUN_DIR/gmi-<k>/timeline.json (k > 0)
    RUN_DIR/profile/gmi-<k>/...       RUN_DIR/gpu_util.csv (where NVML sees a GPU)
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from gmi_drl.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from gmi_drl.config import TrainConfig, to_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """One training run (see the module docstring).

    Attributes:
        run_dir: the run directory.
        config: the run's config: a private copy taken by `create`; nothing writes to it.
        resume_from: the checkpoint the GMIs start from, or ``None`` (a fresh start).
    """

    run_dir: Path
    config: TrainConfig
    resume_from: Path | None = None

    @classmethod
    def create(cls, cfg: TrainConfig) -> "Run":
        """Resolve the directory of ``cfg`` once: the resumed run's (``cfg.resume``, a run
        directory or checkpoint file), ``cfg.run_dir``, or ``runs/<task>-<algo>-<stamp>``.

        Raises:
            CheckpointError: ``cfg.resume`` names no checkpoint.
        """
        cfg = copy.deepcopy(cfg)
        if cfg.resume is not None:
            ckpt = resolve_checkpoint(cfg.resume)
            return cls(ckpt.parent.parent, cfg, ckpt)
        if cfg.run_dir is not None:
            return cls(Path(cfg.run_dir), cfg)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        name = f"{cfg.env.task_id.replace('/', '_')}-{cfg.algo_name}-{stamp}"
        return cls(Path("runs") / name, cfg)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / "latest.pt"

    def gmi_dir(self, gmi_id: int) -> Path:
        """Where GMI ``gmi_id`` writes its own files (GMI 0: the run directory)."""
        return self.run_dir if gmi_id == 0 else self.run_dir / f"gmi-{gmi_id}"

    def profile_dir(self, gmi_id: int) -> Path:
        return self.run_dir / "profile" / f"gmi-{gmi_id}"

    def start(self) -> None:
        """The controller, before any GMI starts: make the directories, write config.json."""
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        saved = to_dict(self.config)
        saved["run_dir"], saved["resume"] = str(self.run_dir), None
        (self.run_dir / "config.json").write_text(json.dumps(saved, indent=2) + "\n")
        log.info("run directory: %s", self.run_dir)

    def restarted(self) -> "Run":
        """This run continued from its latest checkpoint (from the start when none was written):
        what a failed multi-GMI run restarts as."""
        ckpt = self.checkpoint_path
        log.warning("restarting every GMI from %s", ckpt if ckpt.exists() else "the start")
        return Run(self.run_dir, self.config, ckpt if ckpt.exists() else None)

    def load_resume(self) -> dict | None:
        """The checkpoint to continue from, or ``None``.

        Raises:
            CheckpointError: missing, corrupt or of another format.
        """
        return load_checkpoint(self.resume_from) if self.resume_from is not None else None

    def save_checkpoint(self, state: dict) -> None:
        """Write ``state`` (with the config) atomically to ``checkpoints/latest.pt``."""
        save_checkpoint(self.checkpoint_path, {"config": to_dict(self.config), **state})

    @contextlib.contextmanager
    def telemetry(self):
        """The controller's telemetry around the GMIs: samples GPU utilisation and, when
        profiling, says where the controller runs (papers/004: reports are found by host and
        pid) and, at the end, writes the merged report and lists where every report landed."""
        from gmi_drl.telemetry.gpu_util import start_gpu_sampler
        from gmi_drl.telemetry.profiler import list_reports

        cfg = self.config
        profiling, host = cfg.profile.tool != "none", socket.gethostname()
        if profiling:
            log.info("profiling with %s: controller on host %s, pid %d; reports under %s",
                     cfg.profile.tool, host, os.getpid(), self.run_dir.resolve())
        interval = cfg.log.gpu_util_interval_s
        sampler = (start_gpu_sampler(self.run_dir / "gpu_util.csv", interval) if interval > 0
                   else None)
        try:
            yield
        finally:
            if sampler is not None:
                sampler.stop()
        if profiling:
            from gmi_drl.telemetry.report import write_report

            try:
                write_report(self.run_dir)
            except (OSError, ValueError) as e:  # the run itself succeeded: say so, do not fail
                log.warning("profiling: the merged report was not written: %s", e)
            log.info("profiling reports (host %s):\n  %s\nrebuild the merged report with: "
                     "gmi-drl profile report %s", host,
                     "\n  ".join(str(p) for p in list_reports(self.run_dir)), self.run_dir)

    def write_summary(self, result, placement: str) -> Path:
        """Write ``summary.md`` and ``learning_curve.png`` from GMI 0's `LoopResult` and the
        placement's markdown lines; returns the summary's path."""
        from gmi_drl.telemetry.summary import RunSummary, write_summary

        cfg = self.config
        summary = RunSummary(f"{cfg.algo_name.upper()} on {cfg.env.task_id} (seed {cfg.seed})",
                             result.global_step, result.wall_s, result.steps_this_process,
                             result.episode_steps, result.episode_returns, result.phases)
        path = write_summary(summary, self.run_dir, {"Placement": placement})
        log.info("wrote %s", path)
        return path
