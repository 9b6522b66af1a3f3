"""A resumed run: its checkpoint found and loaded once by the controller (`Resume.find`), the
config it continues with (`Resume.config`: the checkpoint's own, ``config.json`` laid over it),
and the check that the checkpoint can serve the config of this attempt (`Resume.check`).

The GMIs load the checkpoint file again in their own processes (`gmi_drl.runner.run.Run`
carries its path); nothing else in the controller reads it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from gmi_drl.checkpoint import CheckpointError, find_loadable, list_checkpoints, run_dir_of
from gmi_drl.config import ConfigError, TrainConfig, from_dict, overlay, to_dict

log = logging.getLogger(__name__)

_WHERE = dict(run_dir=None, resume=None, config=None)
"""the fields that say where a run ran, not what it does"""


@dataclass(frozen=True)
class Resume:
    """What ``--resume`` names, loaded.

    Attributes:
        asked: ``--resume`` as given (a run directory or a checkpoint file), for messages.
        checkpoint: the file every GMI starts from, absolute: the newest of the run that loads.
        stored: the config the checkpoint was written with.
        iteration, global_step: where the checkpoint stands.
        saved_algo: the algorithm's state in the checkpoint less its replay buffer (the
            buffer can be large; only the GMIs load it).
        has_replay: whether the checkpoint holds a replay buffer.
    """

    asked: str
    checkpoint: Path
    stored: TrainConfig
    iteration: int
    global_step: int
    saved_algo: dict
    has_replay: bool

    @property
    def run_dir(self) -> Path | None:
        """The run directory that holds the checkpoint (``None``: a file outside one)."""
        return run_dir_of(self.checkpoint)

    @classmethod
    def find(cls, asked: str | Path) -> "Resume":
        """Load the checkpoint ``asked`` names (a file, or the newest of a run directory that
        loads).

        Raises:
            CheckpointError: no checkpoint that loads (a run stopped before its first checkpoint
                is said to be one). ConfigError: its config does not load.
        """
        asked = str(asked)
        try:
            ckpt, state = find_loadable(asked)
        except CheckpointError as e:
            folder = Path(asked)
            if folder.is_dir() and not list_checkpoints(folder) and any(
                    (folder / name).exists() for name in ("train.log", "metrics.csv", "config.json")):
                raise CheckpointError(f"{e}: the run stopped before its first checkpoint, so "
                                      "nothing can be continued; start it over with the command "
                                      "that started it") from None
            raise
        try:
            stored = from_dict(state["config"])
        except (ConfigError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{ckpt}: its config does not load ({e})") from None
        saved = dict(state.get("algo", {}))
        has_replay = saved.pop("replay", None) is not None
        return cls(asked, ckpt.absolute(), stored, int(state["iteration"]),
                   int(state["global_step"]), saved, has_replay)

    def config(self) -> TrainConfig:
        """The config the resumed run starts from: the checkpoint's own, with its run's
        ``config.json`` laid over it (a field the file leaves out keeps the run's value; a field
        it sets is the user's edit). Where the file is missing or no JSON object (a checkpoint
        copied out of its run, a damaged file), the checkpoint's config alone.

        Raises:
            ConfigError: config.json sets a field this gmi-drl does not know or of the wrong
                type (nothing is overwritten: fix it, or delete it).
        """
        if self.run_dir is None:
            return self.stored
        path = self.run_dir / "config.json"
        try:
            edited = json.loads(path.read_text())
            if not isinstance(edited, dict):
                raise ValueError(f"holds {type(edited).__name__}, not a JSON object")
        except FileNotFoundError:
            return self.stored
        except (OSError, ValueError) as e:
            log.warning("%s: %s; using the config stored in the checkpoint", path,
                        getattr(e, "strerror", None) or e)
            return self.stored
        try:
            return from_dict(overlay(to_dict(self.stored), edited))
        except (ConfigError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path}: {e}\n  (fix it, or delete it to resume with the config "
                              "stored in the checkpoint)") from None

    def edited_config_json(self) -> Path | None:
        """The run's ``config.json`` where it differs from the checkpoint's config in what the
        run does (not where it ran); ``None`` where they agree or no such file loads."""
        on_disk = self._config_json(over_stored=True)
        if on_disk is None:
            return None
        same = (dataclasses.replace(on_disk, **_WHERE)
                == dataclasses.replace(self.stored, **_WHERE))
        return None if same else self.run_dir / "config.json"

    def _config_json(self, over_stored: bool) -> TrainConfig | None:
        if self.run_dir is None:
            return None
        try:
            data = json.loads((self.run_dir / "config.json").read_text())
            return from_dict(overlay(to_dict(self.stored), data) if over_stored else data)
        except (OSError, ValueError, TypeError, AttributeError, KeyError):
            return None  # (ConfigError is a ValueError)

    def check(self, cfg: TrainConfig, algo=None) -> None:
        """Refuse a resume that the checkpoint cannot serve: a config that changes what it
        carries (`conflicts`), a saved replay buffer of another size, a run already at ``cfg``'s last iteration, or, where ``algo``
        (`gmi_drl.runner.preflight.preflight`'s build) is given, weights or optimizer state that
        do not load into it (a dry run of the GMIs' load, the replay buffer left out). A
        checkpoint outside a run directory has no run to continue.

        Raises:
            ConfigError: what does not fit, and what to do instead.
        """
        if self.run_dir is None:
            raise ConfigError(f"--resume {self.asked}: {self.checkpoint} is not in a run's "
                              "checkpoints/ folder, so there is no run to continue; put it in "
                              "RUN_DIR/checkpoints/ with the run's config.json, or start a new "
                              "run (gmi-drl eval reads it as it is)")
        found = conflicts(self.stored, cfg)
        size = getattr(cfg.algo, "buffer_size", None)
        if self.has_replay and size != getattr(self.stored.algo, "buffer_size", None):
            found.append(f"algo.buffer_size={size} (the saved replay buffer holds "
                         f"{self.stored.algo.buffer_size})")
        if not found and algo is not None:
            try:
                algo.load_state_dict(self.saved_algo)
            except (ValueError, KeyError, RuntimeError, TypeError) as e:
                found.append(f"its weights or optimizer state ({str(e).splitlines()[0]})")
        if found:
            self._refuse(found)
        if self.iteration >= cfg.num_iterations:
            ended = (self.iteration >= self.stored.num_iterations
                     and not (self.run_dir / "summary.md").exists())
            raise ConfigError(f"--resume {self.asked}: the run is already at "
                              f"{self.global_step:,} env steps, iteration {self.iteration} of "
                              f"the {cfg.num_iterations} that total_timesteps="
                              f"{cfg.total_timesteps:,} allows; raise --total-timesteps to train "
                              "on" + (" (it was stopped after its last checkpoint, before "
                                      "summary.md; metrics.csv holds its whole learning curve)"
                                      if ended else ""))
        if cfg.profile.tool != "none" and max(cfg.profile.iterations, default=-1) < self.iteration:
            # a warning, not a refusal: a profiled run resumed as it was keeps its old iterations
            log.warning("profile.iterations %s all ran before this resume starts at iteration "
                        "%d: this invocation captures nothing; name later ones with "
                        "--profile.iterations", cfg.profile.iterations, self.iteration)

    def _refuse(self, found: list[str]) -> None:
        changed = self.edited_config_json()
        on_disk = None if changed is None else self._config_json(over_stored=False)
        other = None if on_disk is None else on_disk.algo_name
        if other is not None and other != self.stored.algo_name:
            raise ConfigError(f"--resume {self.asked}: {self.checkpoint} holds a "
                              f"{self.stored.algo_name} run, but {changed} is a {other} run: the "
                              f"checkpoint came from another run. Move it out of "
                              f"{self.checkpoint.parent} (the newest checkpoint of this run is "
                              "used then)")
        edited = ("" if changed is None else
                  f"; with no such flag given, {changed} differs from the checkpoint's own "
                  "config: restore it, or delete it and the checkpoint's copy is used")
        raise ConfigError(f"--resume {self.asked}: the checkpoint cannot continue with "
                          + "; ".join(found) + ". Drop the flags that changed them (a resumed "
                          "run keeps its task, model, normalisers, optimizer and env steps per "
                          f"iteration), or start a new run{edited}")


def conflicts(stored: TrainConfig, cfg: TrainConfig) -> list[str]:
    """What ``cfg`` changes of a run trained with ``stored`` that its checkpoint cannot carry:
    the task, the model, the normalisers and the env steps per iteration (the checkpoint counts
    iterations). Learning rates, schedules and
    ``total_timesteps`` may change."""
    out = []
    if cfg.algo_name != stored.algo_name:
        out.append(f"algo {cfg.algo_name} (trained with {stored.algo_name})")
    if cfg.env.task_id != stored.env.task_id:
        out.append(f"env.task_id={cfg.env.task_id!r} (trained on {stored.env.task_id!r})")
    for section in ("model", "norm"):
        new, old = dataclasses.asdict(getattr(cfg, section)), dataclasses.asdict(
            getattr(stored, section))
        out += [f"{section}.{k}={new[k]!r} (trained with {old[k]!r})" for k in new
                if new[k] != old[k]]
    if (cfg.env.num_envs, cfg.batch_size) != (stored.env.num_envs, stored.batch_size):
        out.append(f"batch_size={cfg.batch_size} env steps per iteration (trained with "
                   f"{stored.batch_size}), from {', '.join(_batch_changes(stored, cfg))}")
    return out


def _batch_changes(stored: TrainConfig, cfg: TrainConfig) -> list[str]:
    """The fields of ``cfg`` that change the env steps per iteration of ``stored``: the env
    count, the GMIs that learn, and each algorithm field that alone changes it."""
    out = [f"{name}={new} (trained with {old})" for name, new, old in (
        ("env.num_envs", cfg.env.num_envs, stored.env.num_envs),
        ("gmi.num_gmis", cfg.gmi.num_gmis, stored.gmi.num_gmis),
        ("gmi.trainer_gmis", cfg.gmi.trainer_gmis, stored.gmi.trainer_gmis)) if new != old]
    if type(cfg.algo) is type(stored.algo):
        n, per = stored.env.num_envs, stored.algo.steps_per_iteration(stored.env.num_envs)
        for f in dataclasses.fields(cfg.algo):
            new, old = getattr(cfg.algo, f.name), getattr(stored.algo, f.name)
            if new != old and dataclasses.replace(
                    stored.algo, **{f.name: new}).steps_per_iteration(n) != per:
                out.append(f"algo.{f.name}={new!r} (trained with {old!r})")
    return out or ["the algorithm's rollout"]
