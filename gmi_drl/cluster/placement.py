"""Where Ray places the GMIs of a layout, and the environment each GMI actor starts with.

Pure functions (Ray is not imported): one resource bundle per GMI, packed onto as few nodes as
possible (``PACK``), a fractional GPU per GMI of a CUDA backend (``1 / GMIs on its device``, so
the GMIs of one device share one GPU), and each actor's ``runtime_env``: the GMI backend's
variables (GMI-DRL §3: MPS active-thread percentage and pinned-memory limit, MIG instance), which
Ray sets in the actor's process before any user code runs, hence before CUDA initialises.
"""

from __future__ import annotations

import os
from typing import Mapping

from gmi_drl.envs.registry import CPU_BUDGET_VAR
from gmi_drl.gmi.backends import BackendKind, GMISpec, mps_env
from gmi_drl.gmi.layout import Layout

STRATEGY = "PACK"
"""Ray placement-group strategy: the bundles go onto as few nodes as fit them."""

NODE_PIN = 0.001
"""amount of a node's ``node:<ip>`` resource a bundle asks for to be tied to that node"""

RAY_KEEPS_CUDA_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
"""with this set, Ray leaves a worker's ``CUDA_VISIBLE_DEVICES`` as its environment gave it"""


def bundles(layout: Layout, num_cpus_per_gmi: float,
            pin_node_ip: str | None = None) -> list[dict[str, float]]:
    """One Ray resource bundle per GMI, in GMI order (bundle ``k`` hosts GMI ``k``).

    Args:
        layout: the planned layout (`gmi_drl.gmi.layout.plan`).
        num_cpus_per_gmi: logical CPUs a GMI reserves.
        pin_node_ip: tie every bundle to the node of this IP (its ``node:<ip>`` resource); the
            ``mig`` backend needs it, since MIG instances exist only on the node that listed them.

    Returns:
        ``[{"CPU": c, "GPU": 1 / gmis_on_device (CUDA backends), "node:<ip>": 0.001 (pinned)}]``.

    Raises:
        ValueError: ``num_cpus_per_gmi <= 0``.
    """
    if num_cpus_per_gmi <= 0:
        raise ValueError(f"num_cpus_per_gmi={num_cpus_per_gmi} must be > 0")
    out = []
    for spec in layout.specs:
        bundle = {"CPU": float(num_cpus_per_gmi)}
        if spec.backend is not BackendKind.CPU:
            bundle["GPU"] = 1.0 / len(layout.mpl[spec.device])
        if pin_node_ip is not None:
            bundle[f"node:{pin_node_ip}"] = NODE_PIN
        out.append(bundle)
    return out


def actor_resources(bundle: Mapping[str, float]) -> dict:
    """Ray actor options that ask for exactly ``bundle``: ``num_cpus``, ``num_gpus`` and the
    remaining (custom) ``resources``."""
    rest = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0),
            "resources": rest}


def actor_env(spec: GMISpec, num_cpus_per_gmi: float, mps_dir: str | None) -> dict[str, str]:
    """The backend variables of one GMI actor (the Ray twin of `gmi_drl.gmi.backends.process_env`).

    ``cpu``: no GPU visible. ``cuda_shared`` / ``cuda_mps``: Ray picks the GPU from the bundle's
    fraction and sets ``CUDA_VISIBLE_DEVICES`` itself; MPS adds its client variables
    (`gmi_drl.gmi.backends.mps_env`; the pinned-memory limit is for device 0, the one GPU the
    actor sees). ``mig``: the instance's ``MIG-<uuid>``, kept as is by Ray. Thread counts and
    the env workers' CPU budget (`gmi_drl.envs.registry.cpu_budget`) follow
    ``num_cpus_per_gmi``. CPU affinity is left to the node: core numbers of the planning machine
    mean nothing on another node.

    Raises:
        ValueError: ``cuda_mps`` without ``mps_dir``, or ``mig`` without an instance.
    """
    cpus = str(max(1, int(num_cpus_per_gmi)))
    env = {"OMP_NUM_THREADS": cpus, CPU_BUDGET_VAR: cpus}  # (env workers size to it)
    if spec.backend is BackendKind.CPU:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif spec.backend is BackendKind.CUDA_MPS:
        env.update(mps_env(spec, mps_dir))
    elif spec.backend is BackendKind.MIG:
        if spec.mig_uuid is None:
            raise ValueError(f"GMI {spec.gmi_id}: the mig backend needs a MIG instance")
        env["CUDA_VISIBLE_DEVICES"] = spec.mig_uuid
        env[RAY_KEEPS_CUDA_VISIBLE_DEVICES] = "1"
    return env


def runtime_env(env_vars: Mapping[str, str], code_dir: str,
                extra: Mapping | None = None) -> dict:
    """One actor's Ray ``runtime_env``: ``env_vars`` plus ``PYTHONPATH`` led by ``code_dir``, merged
    with ``extra`` (another part's per-actor settings, e.g. a profiler's ``{"nsight": ...}``).

    ``code_dir`` is the directory that holds the driver's ``gmi_drl`` package: workers on the
    driver's machine then import the very code the driver runs (a checkout); on other machines
    the path is absent and their installed gmi-drl is used. ``${PYTHONPATH}`` keeps the node's own.

    Raises:
        ValueError: ``extra`` sets an environment variable the GMI's backend sets too.
    """
    env = {"PYTHONPATH": f"{code_dir}{os.pathsep}${{PYTHONPATH}}", **env_vars}
    extra = dict(extra or {})
    extra_vars = dict(extra.pop("env_vars", {}))
    clash = sorted(set(extra_vars) & set(env))
    if clash:
        raise ValueError(f"runtime_env env_vars {clash} would override the GMI backend's "
                         "variables; leave them to the launcher")
    return {**extra, "env_vars": {**extra_vars, **env}}
