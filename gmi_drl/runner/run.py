"""The run: its directory (resolved once), its frozen config, checkpoints and ``summary.md``.

The controller makes one `Run` per call of `gmi_drl.train.train`; it travels (pickled) to every
GMI, which reads its config and writes through it: GMI 0 the metrics, and the checkpoints with
``config.json`` beside them; every GMI its timeline. Only the controller writes ``summary.md``.

Directory layout::

    RUN_DIR/config.json  metrics.csv  events.*  timeline.json  summary.md  learning_curve.png
    RUN_DIR/checkpoints/iteration-<k>.pt (the newest checkpoint.keep)  RUN_DIR/train.log
    RUN_DIR/gmi-<k>/timeline.json (k > 0)
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

from gmi_drl.checkpoint import (checkpoint_iteration, checkpoint_name, find_loadable,
                                list_checkpoints, load_checkpoint, prune_checkpoints,
                                save_checkpoint)
from gmi_drl.config import ConfigError, TrainConfig, to_dict
from gmi_drl.errors import TrainingDiverged, check_finite, out_of_memory
from gmi_drl.files import write_text_atomically

log = logging.getLogger(__name__)


class RunStopped(RuntimeError):
    """The run stopped on an expected failure: a GMI or env worker died, hung or raised, the
    switch did not answer, weights went NaN (`TrainingDiverged`), memory ran out, or an
    interrupt (Ctrl-C, SIGTERM, a hangup). The cause is chained (``__cause__``) and its
    traceback is in the run's ``train.log``.

    Attributes:
        run_dir: the run directory. log_path: its ``train.log``.
        reason: what happened, in one line.
        next_step: what to run next, in one line: ``gmi-drl train ALGO --resume RUN_DIR`` when a
            checkpoint was written.
    """

    def __init__(self, run: "Run", cause: BaseException) -> None:
        from gmi_drl.gmi.launcher import GMIError

        self.run_dir, self.log_path = run.run_dir, run.log_path
        if isinstance(cause, KeyboardInterrupt):
            self.reason = "interrupted; the run was stopped"
        elif isinstance(cause, GMIError):
            self.reason = cause.summary
        else:
            lines = str(cause).strip().splitlines()
            self.reason = (f"{type(cause).__name__}: {lines[0]}" if lines
                           else type(cause).__name__) + "; the run was stopped"
        if not run.run_dir.is_dir():
            self.next_step = (f"its directory {run.run_dir} is gone (removed while the run "
                              "trained), checkpoints and train.log with it: start the run again")
        elif isinstance(cause, TrainingDiverged) or (
                isinstance(cause, GMIError) and cause.exception.startswith("TrainingDiverged")):
            self.next_step = ("resuming with the same settings would repeat it: start a new run "
                              "with the changes above")
        elif out_of_memory(cause):
            self.next_step = ("it ran out of memory: running it again needs smaller sizes (for "
                              "example --algo.buffer-size, --algo.fragments-per-batch, "
                              "--env.num-envs, the --model.* sizes) or fewer GMIs")
        elif isinstance(cause, GMIError) and cause.exception.startswith("CheckpointError"):
            self.next_step = ("the checkpoint did not load into this run: resume with the run's "
                              "own flags, or start a new run")
        elif (found := list_checkpoints(run.run_dir)) and checkpoint_iteration(
                found[0]) >= run.config.num_iterations:
            self.next_step = (
                f"its last checkpoint was already at the run's {run.config.total_timesteps:,} "
                "env steps: training had ended, and metrics.csv holds the whole learning curve "
                "(summary.md was not written); to train on: gmi-drl train "
                f"{run.config.algo_name} --resume {run.run_dir} --total-timesteps MORE")
        elif found:
            self.next_step = (f"continue with: gmi-drl train {run.config.algo_name} "
                              f"--resume {run.run_dir}")
        elif isinstance(cause, KeyboardInterrupt):  # nothing went wrong to deal with first
            self.next_step = "no checkpoint was written: run the same command to start over"
        else:
            self.next_step = ("no checkpoint was written: once the cause above is dealt with, "
                              "run the same command again")
        super().__init__(f"{self.reason} (traceback: {self.log_path})")


def _check_writable(directory: Path) -> None:
    """Raise `ConfigError` when no file can be made in ``directory`` (permissions, an
    immutable or read-only mount): found at the start, not at the first checkpoint, minutes
    of training later."""
    probe = directory / f".writable.{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{directory} cannot be written ({e.strerror or e}): fix its "
                          "permissions, or choose another --run-dir") from None


class _LogFile(logging.FileHandler):
    """``train.log``'s handler: a record that cannot be written (a full disk, a directory
    removed under the run) is dropped, not reported with a traceback of its own on stderr,
    where it would bury the message that says why the run stopped."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


@dataclass(frozen=True)
class Run:
    """One training run (see the module docstring).

    Attributes:
        run_dir: the run directory, absolute (GMIs on Ray run in the workers' own working
            directory, not the driver's).
        config: the run's config: a private copy taken by `create`; nothing writes to it.
        resume_from: the checkpoint the GMIs start from (absolute), or ``None`` (a fresh start).

    A pickled run carries its task as `gmi_drl.envs.register` registered it in this process
    (`gmi_drl.envs.registry.registration`), and a GMI process that unpickles it registers the
    task too; pickling raises ``ValueError`` where that registration does not pickle.
    """

    run_dir: Path
    config: TrainConfig
    resume_from: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_dir", Path(self.run_dir).absolute())
        if self.resume_from is not None:
            object.__setattr__(self, "resume_from", Path(self.resume_from).absolute())

    def __getstate__(self) -> dict:
        from gmi_drl.envs.registry import registration

        return {**self.__dict__, "task_registration": registration(self.config.env.task_id)}

    def __setstate__(self, state: dict) -> None:
        from gmi_drl.envs.registry import adopt

        state = dict(state)
        blob = state.pop("task_registration", None)
        self.__dict__.update(state)
        adopt(blob)

    @classmethod
    def create(cls, cfg: TrainConfig, resume=None) -> "Run":
        """Resolve the directory of ``cfg`` once: the resumed run's (``resume``, a
        `gmi_drl.runner.resume.Resume` of ``cfg.resume``: every GMI starts from its checkpoint),
        ``cfg.run_dir``, or ``runs/<task>-<algo>-<stamp>``. A resumed run stays in its own
        directory (``cfg.run_dir`` is not used). A new directory is claimed when it is made
        (``mkdir``), so two runs started in the same second get two directories.
        """
        cfg = copy.deepcopy(cfg)
        if resume is not None:
            return cls(resume.run_dir, cfg, resume.checkpoint)
        if cfg.run_dir is not None:
            return cls(Path(cfg.run_dir), cfg)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        base = Path("runs") / f"{cfg.env.task_id.replace('/', '_')}-{cfg.algo_name}-{stamp}"
        base.parent.mkdir(parents=True, exist_ok=True)
        for k in range(1, 1000):
            path = base if k == 1 else base.with_name(f"{base.name}-{k}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return cls(path, cfg)
        raise FileExistsError(f"{base}: 999 runs of this name exist; pass --run-dir")

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def log_path(self) -> Path:
        """``train.log``: the controller's log and the traceback of a failure."""
        return self.run_dir / "train.log"

    def gmi_dir(self, gmi_id: int) -> Path:
        """Where GMI ``gmi_id`` writes its own files (GMI 0: the run directory)."""
        return self.run_dir if gmi_id == 0 else self.run_dir / f"gmi-{gmi_id}"

    def profile_dir(self, gmi_id: int) -> Path:
        return self.run_dir / "profile" / f"gmi-{gmi_id}"

    def start(self) -> None:
        """The controller, before any GMI starts: make the directories and check that
        checkpoints can be written there (`ConfigError` if not). A fresh start in a directory
        that holds an attempt stopped before its first checkpoint drops that attempt's metrics
        (`gmi_drl.config.validate` refuses one with checkpoints). ``config.json`` is written
        with each checkpoint (`save_checkpoint`): an attempt that stops before its first one
        leaves the run's config.json as it was."""
        (self.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        _check_writable(self.checkpoint_dir)
        if self.resume_from is None:
            for old in [self.run_dir / "metrics.csv", *self.run_dir.glob("events.out.tfevents.*")]:
                old.unlink(missing_ok=True)
        log.info("run directory: %s", self.run_dir)

    @contextlib.contextmanager
    def claimed(self):
        """Hold the run directory for the block: an exclusive ``flock`` on ``RUN_DIR/.lock``
        (released when this process exits, however it exits), so that a second ``train`` or
        ``--resume`` of the same directory is refused instead of writing beside this one.

        Raises:
            ConfigError: another process holds the directory, or it cannot be written.
        """
        import fcntl

        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            f = open(self.run_dir / ".lock", "a+")
        except OSError as e:
            raise ConfigError(f"cannot write the run directory {self.run_dir}: {e.strerror}; "
                              "choose another --run-dir") from None
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "?"
                instead = ("" if self.config.resume else ", or choose another --run-dir")
                raise ConfigError(f"{self.run_dir} is in use by a running gmi-drl (pid "
                                  f"{holder}); wait for it to end{instead}") from None
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def restarted(self) -> "Run":
        """This run continued from its newest checkpoint that loads (from the start when none
        was written): what a failed multi-GMI run restarts as.

        Raises:
            CheckpointError: checkpoints were written and none loads.
        """
        ckpt = find_loadable(self.run_dir)[0] if list_checkpoints(self.run_dir) else None
        log.warning("restarting every GMI from %s", ckpt or "the start")
        return Run(self.run_dir, self.config, ckpt)

    def load_resume(self) -> dict | None:
        """The checkpoint to continue from, or ``None``.

        Raises:
            CheckpointError: missing, corrupt or of another format.
        """
        return load_checkpoint(self.resume_from) if self.resume_from is not None else None

    def save_checkpoint(self, state: dict) -> Path:
        """Write ``config.json`` (the run's config, the file a user edits between resumes),
        then ``state`` with the config to ``checkpoints/iteration-<k>.pt`` (``k =
        state["iteration"]``), each atomically, then delete all but the newest
        ``checkpoint.keep``; returns the checkpoint written. (In this order a kill between the
        two leaves a config.json that the newest checkpoint's config is overlaid with, which
        is this attempt's own.)

        Raises:
            TrainingDiverged: a weight is NaN or infinite (nothing is written)."""
        check_finite(state["algo"]["modules"], int(state["global_step"]))
        saved = to_dict(self.config)
        saved["run_dir"], saved["resume"] = str(self.run_dir), None
        write_text_atomically(self.run_dir / "config.json",
                              json.dumps(saved, indent=2, allow_nan=False) + "\n")
        path = self.checkpoint_dir / checkpoint_name(int(state["iteration"]))
        save_checkpoint(path, {"config": to_dict(self.config), **state})
        prune_checkpoints(self.checkpoint_dir, self.config.checkpoint.keep)
        return path

    @contextlib.contextmanager
    def log_file(self):
        """Inside the block, gmi-drl's log records also go to ``train.log``, and an exception
        leaving the block is written there with its traceback (then re-raised)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handler = _LogFile(self.log_path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        package = logging.getLogger("gmi_drl")
        package.addHandler(handler)
        try:
            yield
        except BaseException as e:
            handler.handle(logging.LogRecord(log.name, logging.ERROR, __file__, 0,
                                             "the run stopped", None, (type(e), e, e.__traceback__)))
            raise
        finally:
            package.removeHandler(handler)
            try:
                handler.close()
            except OSError:  # a full disk: the terminal still gets the one-line message
                pass

    @contextlib.contextmanager
    def telemetry(self):
        """The controller's telemetry around the GMIs: samples GPU utilisation and, when
        profiling, says where the controller runs (the Nsight-on-Ray article: reports are
        found by host and pid) and, at the end, writes the merged report and lists where every
        report landed."""
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
                             result.episode_steps, result.episode_returns, result.phases,
                             _episodes_of(cfg), result.steady_sps)
        sections = {"Placement": placement}
        if cfg.config is not None:
            sections["Config"] = config_origin(cfg.config)
        path = write_summary(summary, self.run_dir, sections)
        log.info("wrote %s", path)
        return path


def _episodes_of(cfg) -> str:
    """Whose episodes GMI 0's result holds, where other GMIs finish episodes too."""
    g = cfg.gmi
    if cfg.is_async:
        return (f"those in trainer GMI 0's batches, of {g.trainer_gmis} trainer GMIs"
                if g.trainer_gmis > 1 else "")
    return f"GMI 0's envs, of {g.num_gmis} GMIs" if g.num_gmis > 1 else ""


def config_origin(path: str) -> str:
    """Markdown lines for `summary.md` on where the config's defaults came from: ``path``
    (``--config``), and, for ``tuned.json`` of `gmi-drl tune`, the point it chose."""
    import json

    text = f"- defaults from `{path}` (--config); flags given after it override it\n"
    try:
        tune = json.loads(open(path).read()).get("tune")
    except (OSError, ValueError, AttributeError):
        return text + "- (the file is no longer readable)\n"
    if tune:
        try:
            text += (f"- tuned by `gmi-drl tune` on {tune['date']} (GMI-DRL Algorithm 2, chosen "
                     f"by {tune['chosen_by']}): num_envs {tune['num_envs']}, "
                     f"{tune['gmis_per_device']} {tune.get('gmis_counted', 'GMI(s)')} per "
                     f"device x {tune['num_devices']} device(s), estimate "
                     f"{tune['estimate']:,.0f} {tune.get('unit', 'env steps/s')}; "
                     f"{tune['points']} points in {tune['search_s']} s\n")
        except (KeyError, TypeError, ValueError):  # a hand-edited record
            text += "- tuned by `gmi-drl tune` (its record in the file is incomplete)\n"
    return text
