"""The run configuration's rules between fields, and `validate`, which checks every field and
rule at once, before anything starts.

A field's own type and bounds are declared on it and checked by `gmi_drl.config.bounds`; the
rules here relate fields to each other, to the task and to the machine (a task that exists, an
engine it has, a seed its engine takes, addresses that resolve, a run directory that is free).
An algorithm's own rules are its config's `validate` (`gmi_drl.algos.base.AlgoConfig`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
from typing import Callable

import gymnasium as gym

from gmi_drl.algos import algo_name
from gmi_drl.config.bounds import field_errors
from gmi_drl.config.presets import PRESETS, task_family
from gmi_drl.config.schema import AsyncConfig, InvalidConfig, RayConfig, TrainConfig
from gmi_drl.models.mlp import ACTIVATIONS, parse_layers
from gmi_drl.telemetry.profiler import ROLES, ProfilerConfig


def validate(cfg: TrainConfig) -> None:
    """Check every field (`gmi_drl.config.bounds.field_errors`: types and declared bounds) and
    every rule between fields at once, before anything starts.

    Raises:
        InvalidConfig: listing every invalid field, one per line: the fields that do not hold
            on their own first, in declaration order (only those, where a field is not of its
            type: the rules compare values), then the broken rules; a field named among the
            first is not named again by a rule it also breaks.
    """
    if not isinstance(cfg, TrainConfig):
        raise InvalidConfig(f"invalid config: {cfg!r} is no TrainConfig (gmi_drl.config.preset "
                            "makes one)")
    fields = field_errors(cfg)
    errors = [e.message for e in fields]
    if not any(e.kind == "type" for e in fields):
        named = {e.field for e in fields}
        errors += [rule for rule in dict.fromkeys(_broken_rules(cfg))
                   if rule.split("=", 1)[0] not in named]
    if errors:
        raise InvalidConfig("invalid config:\n  " + "\n  ".join(errors))


def _broken_rules(cfg: TrainConfig) -> list[str]:
    """Every broken rule between fields of ``cfg``, whose fields are of their types."""
    errors = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    engines = _validate_task(cfg, need)
    e = cfg.env
    need(e.num_workers is None or e.num_workers <= e.num_envs,
         f"env.num_workers={e.num_workers} must be in [1, env.num_envs={e.num_envs}] or None")
    errors += cfg.algo.validate(e.num_envs, cfg.gmi.num_gmis)
    starts = getattr(cfg.algo, "learning_starts", None)
    if starts is not None and e.num_envs >= 1 and cfg.total_timesteps >= cfg.batch_size:
        per_gmi = cfg.num_iterations * cfg.algo.steps_per_iteration(e.num_envs)
        need(starts <= per_gmi, f"algo.learning_starts={starts:,} env steps, but each GMI "
             f"takes {per_gmi:,}: nothing would be trained; lower --algo.learning-starts or "
             "raise --total-timesteps")
    _validate_gmi(cfg, need)
    _validate_placement(cfg, need)
    need(cfg.total_timesteps >= cfg.batch_size,
         f"total_timesteps={cfg.total_timesteps} must be >= batch_size={cfg.batch_size} "
         "(at least one iteration)")
    _validate_model(cfg, need)
    _validate_profile(cfg, need)
    _validate_seed(cfg, engines, need)
    _validate_machine(cfg, need)
    return errors


def _validate_task(cfg: TrainConfig, need: Callable[[bool, str], None]) -> list[str] | None:
    """The task's rules; returns its engines (empty where MuJoCo does not import), or None for
    a task that is not registered."""
    from gmi_drl.envs import engines, list_tasks
    from gmi_drl.envs.builtin_tasks import mujoco_unavailable

    e = cfg.env
    if not (e.task_id in list_tasks() or e.task_id in gym.registry):
        no_mujoco = mujoco_unavailable()
        need(False, f"env.task_id={e.task_id!r} is neither a gmi-drl task nor a Gymnasium id"
             + (f" (or a MuJoCo task: {no_mujoco})" if no_mujoco else "")
             + _nearest_task(e.task_id))
        return None
    try:
        names = engines(e.task_id)
    except ValueError as err:  # a MuJoCo task where MuJoCo does not import
        need(False, f"env.{err}")
        return []
    need(e.engine == "auto" or e.engine in names,
         f"env.engine={e.engine!r} must be one of {['auto', *names]} for {e.task_id}")
    return names


def _nearest_task(task_id: str) -> str:
    """`` (did you mean 'X'?)`` for the registered task nearest ``task_id``, else how to list
    them."""
    from gmi_drl.envs import list_tasks

    names = {name.lower(): name for name in [*gym.registry, *list_tasks()]}
    near = difflib.get_close_matches(task_id.lower(), names, n=1, cutoff=0.85)
    return (f" (did you mean {names[near[0]]!r}?)" if near else
            "; python -c 'import gmi_drl.envs as e; print(e.list_tasks())' lists gmi-drl's own")


def _validate_model(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    m = cfg.model
    for name in ("actor_hidden", "critic_hidden"):
        value = getattr(m, name)
        try:
            parse_layers(f"1:{value}:1")  # the hidden sizes between the task's in and out
        except ValueError:
            need(False, f"model.{name}={value!r} must be positive ints joined by ':' "
                 "(e.g. '64:64')")
    need(m.activation in ACTIVATIONS,
         f"model.activation={m.activation!r} must be one of {sorted(ACTIVATIONS)}")


def _validate_seed(cfg: TrainConfig, engines: list[str] | None,
                   need: Callable[[bool, str], None]) -> None:
    """Env i of the run (over its GMIs) is seeded seed + i: ALE's and the warp engine's seeds
    are 31-bit, the other engines' 64-bit (and Gymnasium takes no negative ones)."""
    e, g = cfg.env, cfg.gmi
    bits = 31 if engines is not None and (task_family(e.task_id) == "atari" or "warp" in (
        engines[:1] if e.engine == "auto" else [e.engine])) else 62
    envs = e.num_envs * (g.trainer_gmis + g.serving_gmis if cfg.is_async else g.num_gmis)
    need(0 <= cfg.seed <= 2**bits - envs,
         f"seed={cfg.seed} must be in [0, 2**{bits} - {envs}] (env i of the run's {envs} is "
         f"seeded seed + i, and {e.task_id}'s engine takes seeds below 2**{bits})")


def _validate_machine(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    """What this machine and its files must offer: CUDA, a run directory to continue or to
    start in."""
    from gmi_drl.checkpoint import list_checkpoints

    if cfg.device == "cuda":
        import torch

        need(torch.cuda.is_available(),
             "device='cuda' but torch sees no CUDA device (CPU build of torch, or no driver); "
             "use --device cpu")
        need(cfg.precision != "bf16-mixed" or not torch.cuda.is_available()
             or torch.cuda.is_bf16_supported(),
             "precision='bf16-mixed' but this GPU has no bfloat16 arithmetic (before Ampere); "
             "use --precision fp32")
    algo = algo_name(cfg.algo)
    need(cfg.preset == "auto" or cfg.preset in PRESETS.get(algo, {}),
         f"preset={cfg.preset!r} must be one of {['auto', *PRESETS.get(algo, {})]}")
    if cfg.resume is not None:  # (a run made from --config keeps that path in its config)
        need(os.path.exists(cfg.resume), f"resume={cfg.resume!r} does not exist")
    elif cfg.run_dir is not None and not cfg.run_dir.strip():
        need(False, f"run_dir={cfg.run_dir!r} is empty: give a directory (or leave "
             "--run-dir out for a new one under runs/)")
    elif cfg.run_dir is not None:
        # a run stopped before its first checkpoint holds nothing to continue: it starts over
        need(not list_checkpoints(cfg.run_dir),
             f"run_dir={cfg.run_dir!r} already holds a run with checkpoints; pass --resume "
             f"{cfg.run_dir} to continue it, or choose another --run-dir")
        dirs = [cfg.run_dir, os.path.join(cfg.run_dir, "checkpoints")]
        if cfg.profile.tool != "none":
            dirs.append(os.path.join(cfg.run_dir, "profile"))
        files = [d for d in dirs if os.path.exists(d) and not os.path.isdir(d)]
        need(not files, f"{files[0] if files else ''} is a file where the run writes a "
             "directory: move it, or choose another --run-dir")


def _validate_gmi(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    g = cfg.gmi
    spread, name = ((g.trainer_gmis, "gmi.trainer_gmis") if cfg.is_async
                    else (g.num_gmis, "gmi.num_gmis"))  # the GMIs num_devices lays out
    need(g.num_devices is None or g.num_devices <= max(spread, 1),
         f"gmi.num_devices={g.num_devices} must be in [1, {name}={spread}] or None")
    if g.reduction == "switch":
        addrs = g.switch_addrs
        need(len(addrs) == max(g.num_gmis, 1) and all(_is_host_port(a) for a in addrs),
             f"gmi.switch_addr={g.switch_addr!r} must be HOST:PORT, or one HOST:PORT per GMI "
             f"joined by ',' ({g.num_gmis}), when gmi.reduction is switch")
        if cfg.placement != "ray":  # (a Ray cluster's GMIs resolve it on their own nodes)
            lost = sorted({a.rpartition(":")[0] for a in addrs if _is_host_port(a)
                           and not _resolves(a.rpartition(":")[0])})
            need(not lost, f"gmi.switch_addr={g.switch_addr!r}: {', '.join(lost)} does not "
                 "resolve here (a typo, or a name this host's DNS does not know?)")
    need(g.reduction == "switch" or (g.switch_job is None and not g.switch_token),
         f"gmi.switch_job / gmi.switch_token set, but gmi.reduction={g.reduction!r}; they are "
         "the run's credentials at the aggregation switch (gmi.reduction switch)")
    flags = _from_flags(cfg)
    need(not flags or g.reduction == "switch" or g.switch_addr is None,
         f"gmi.switch_addr set, but gmi.reduction={g.reduction!r}: add --gmi.reduction switch")
    need(not flags or g.reduction == "ps" or g.ps_addr is None,
         f"gmi.ps_addr set, but gmi.reduction={g.reduction!r}: add --gmi.reduction ps")
    if g.reduction == "ps":
        need(_is_host_port(g.ps_addr or ""), f"gmi.ps_addr={g.ps_addr!r} must be HOST:PORT when "
             "gmi.reduction is ps (start the server with `python -m gmi_drl.comm.ps --bind "
             "HOST:PORT --workers N`)")
    if g.netns is not None:
        names = g.netns_list
        need(len(names) == g.num_gmis, f"gmi.netns={g.netns!r} must name one network namespace "
             f"per GMI ({g.num_gmis}), joined by ','")
        missing = [n for n in names if not os.path.exists(os.path.join("/var/run/netns", n))]
        need(not missing, f"gmi.netns: no network namespace {missing} (make them with "
             "`ip netns add`, or `gmi_drl.comm.switch.netns.Rack`)")
        need(os.geteuid() == 0, "gmi.netns needs root (joining a network namespace)")
    need(g.reduction == "auto" or cfg.num_trainers >= 2,
         f"gmi.reduction={g.reduction!r} reduces between GMIs: needs "
         f"{'gmi.trainer_gmis' if cfg.is_async else 'gmi.num_gmis'} >= 2, not {cfg.num_trainers}")
    _validate_template(cfg, need)
    need(g.staleness == 0 or g.reduction in ("switch", "ps"),
         f"gmi.staleness={g.staleness} needs gmi.reduction switch or ps, not {g.reduction!r} "
         "(stale-sync training keeps aggregation rounds in flight at the switch; Async PS "
         "applies each GMI's update at the parameter server as it arrives; other reductions "
         "are synchronous collectives)")
    need(g.reduction != "ps" or g.staleness < 1 << 32, f"gmi.staleness={g.staleness} must be "
         "< 2**32 with gmi.reduction ps (the parameter server's hello carries it as a u32)")
    _validate_threshold(cfg, need)


def _validate_threshold(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    """Async iSwitch (H, S): the switch's threshold mode, its ranges (`protocol.ThresholdValue`)."""
    g, n = cfg.gmi, cfg.num_trainers
    need(g.reduction != "switch" or g.staleness < 128, f"gmi.staleness={g.staleness} must be "
         "< 128 with gmi.reduction switch (the switch compares weight versions mod 256); a "
         "bound that large is no bound: lower it")
    if g.threshold is None:
        return
    need(not cfg.is_async, f"gmi.threshold={g.threshold} is Async iSwitch of the sync_training "
         f"template's GMIs; {algo_name(cfg.algo)} runs async_training: drop --gmi.threshold")
    need(g.reduction == "switch",
         f"gmi.threshold={g.threshold} needs gmi.reduction switch, not {g.reduction!r} (only "
         "the aggregation switch counts gradients up to a threshold; drop --gmi.threshold for "
         "a synchronous reduction)")
    need(1 <= g.threshold <= min(n, 255),
         f"gmi.threshold={g.threshold} must be in [1, {min(n, 255)}] (the trainer GMIs: H "
         "gradients per aggregate, from any of them; a packet's count holds at most 255); use "
         f"--gmi.threshold {min(n, 255)} or fewer")
    need(g.threshold == n or g.staleness >= 1,
         f"gmi.threshold={g.threshold} < {n} GMIs with gmi.staleness=0 is synchronous training "
         "that drops every gradient but the first H of each aggregate: give --gmi.staleness 1 "
         f"or more (the paper uses 3), or --gmi.threshold {n}")


def _validate_template(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    g, a, name = cfg.gmi, cfg.async_, algo_name(cfg.algo)
    if not cfg.is_async:
        changed = [f"async.{f.name}" for f in dataclasses.fields(AsyncConfig)
                   if getattr(a, f.name) != f.default]
        changed += [f"gmi.{n}" for n in ("serving_gmis", "trainer_gmis") if getattr(g, n) != 1]
        changed += ["gmi.trainer_share"] if g.trainer_share is not None else []
        need(not changed, f"{', '.join(changed)} set, but {name} runs in the sync_training "
             "template; use appo or a3c")
        return
    need(g.num_gmis == 1, f"gmi.num_gmis={g.num_gmis} is the holistic GMIs of sync_training; "
         "an async_training run has gmi.serving_gmis and gmi.trainer_gmis")
    need(g.reduction in ("auto", "mpr", "mrr", "har", "ring"),
         f"gmi.reduction={g.reduction!r}: trainer GMIs of an async_training run reduce with "
         "auto, mpr, mrr, har or ring")
    need(not a.lockstep or g.serving_gmis == g.trainer_gmis == 1,
         f"async.lockstep orders the fragments of one serving GMI for one trainer GMI, not "
         f"gmi.serving_gmis={g.serving_gmis} and gmi.trainer_gmis={g.trainer_gmis}")
    need(cfg.placement != "serial" or g.serving_gmis == g.trainer_gmis == 1,
         f"placement='serial' runs one serving and one trainer GMI in one process, not "
         f"gmi.serving_gmis={g.serving_gmis} and gmi.trainer_gmis={g.trainer_gmis}")
    need(cfg.profile.tool == "none", f"profile.tool={cfg.profile.tool!r}: capture ranges are "
         "per sync_training iteration; an async_training run writes its timeline.json only")
    from gmi_drl.comm.channels.fabric import channel_rules

    for rule in channel_rules(a.channel, a.fragments_per_transfer, a.channel_slots,
                              a.backpressure):
        need(False, rule)
    need(a.env_splits < 1 or cfg.env.num_envs % a.env_splits == 0,
         f"async.env_splits={a.env_splits} must be >= 1 and divide env.num_envs="
         f"{cfg.env.num_envs}")
    need(not a.tolerate_serving_failures or cfg.placement == "local",
         "async.tolerate_serving_failures needs a process per GMI (--placement local)")


def _validate_placement(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    g, r = cfg.gmi, cfg.ray
    if cfg.placement != "ray" and _from_flags(cfg):  # (a resumed Ray run keeps its ray.*)
        changed = [f"ray.{f.name}" for f in dataclasses.fields(RayConfig)
                   if getattr(r, f.name) != f.default]
        need(not changed, f"{', '.join(changed)} set but placement={cfg.placement!r}; add "
             "--placement ray")
    if cfg.placement == "serial":
        need(g.reduction in ("auto", "mpr", "switch", "ps"),
             f"gmi.reduction={g.reduction!r} with placement='serial': GMIs in one process "
             "reduce through shared memory (auto, mpr), the switch or a parameter server; the "
             "others need a process per GMI (--placement local)")
        need(g.netns is None, "gmi.netns needs a process per GMI (--placement local)")
        need(cfg.profile.tool == "none" or cfg.profile.all_ranks is False
             and len(cfg.profile.ranks) == 1,
             "placement='serial' profiles one GMI (the profilers are per process): give one "
             "--profile.ranks id")
    if cfg.placement != "ray":
        return
    need(importlib.util.find_spec("ray") is not None,
         "placement='ray' needs the ray package: pip install -e '.[ray]' in the checkout")
    if cfg.is_async:
        need(g.reduction == "auto", f"gmi.reduction={g.reduction!r} is for the local "
             "placement; on Ray the trainer GMIs of an async_training run reduce through a "
             "gloo ring wherever Ray placed them: use gmi.reduction auto")
    else:
        need(g.reduction in ("auto", "switch", "ps"), f"gmi.reduction={g.reduction!r} is for "
             "the local placement; on Ray the reduction follows the nodes (HAR across nodes, "
             "MPR within one): use gmi.reduction auto, or a service every GMI reaches: switch "
             "or ps")
    need(g.netns is None, "gmi.netns is for the local placement (namespaces of this machine)")
    need(len(set(g.switch_addrs)) <= 1, f"gmi.switch_addr={g.switch_addr!r}: with "
         "placement='ray' give one switch address for all GMIs")
    need(r.address is None or r.address == "auto" or _is_host_port(r.address),
         f"ray.address={r.address!r} must be auto or HOST:PORT (the head node's address)")


def _validate_profile(cfg: TrainConfig, need: Callable[[bool, str], None]) -> None:
    pr = cfg.profile
    if pr.tool == "none":
        if _from_flags(cfg):
            default = ProfilerConfig()
            changed = [f"profile.{f.name}" for f in dataclasses.fields(pr)
                       if getattr(pr, f.name) != getattr(default, f.name)]
            need(not changed, f"{', '.join(changed)} set but profile.tool='none': add "
                 "--profile.tool torch (or nsys)")
        return
    need(pr.nvtx or pr.tool == "nsys" or not _from_flags(cfg),
         "profile.nvtx=False with profile.tool='torch': NVTX ranges are for nsys; drop "
         "--profile.no-nvtx")
    n_iter, n_gmis = cfg.num_iterations, cfg.gmi.num_gmis
    need(len(pr.iterations) > 0, "profile.iterations is empty: name the iterations to capture, "
         "e.g. --profile.iterations 3 4")
    bad = [s for s in pr.iterations if not 0 <= s < n_iter]
    need(not bad, f"profile.iterations={pr.iterations}: {bad} outside the run's iterations "
         f"[0, num_iterations={n_iter})")
    need(pr.all_ranks or len(pr.ranks) > 0,
         "profile.ranks is empty: name GMI ids (e.g. --profile.ranks 0) or pass --profile.all-ranks")
    bad = [r for r in pr.ranks if not 0 <= r < n_gmis]
    need(pr.all_ranks or not bad,
         f"profile.ranks={pr.ranks}: {bad} outside the GMI ids [0, gmi.num_gmis={n_gmis})")
    need(len(pr.roles) > 0,
         f"profile.roles={pr.roles} must be a non-empty subset of {list(ROLES)}")


def _from_flags(cfg: TrainConfig) -> bool:
    """Whether the config's fields are the user's flags over a preset: not a resumed run's or a
    ``--config`` file's, which carry fields the user did not give (checks that a field is set
    to no effect apply to flags only)."""
    return cfg.resume is None and cfg.config is None


def _resolves(host: str) -> bool:
    import socket

    try:
        socket.getaddrinfo(host, None)
        return True
    except (OSError, UnicodeError):
        return False


def _is_host_port(text: str) -> bool:
    host, _, port = text.rpartition(":")
    return (bool(host) and "/" not in host and port.isdigit()  # ("ray://h:p" is no HOST:PORT)
            and 0 < int(port) < 65536)
