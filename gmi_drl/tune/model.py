"""The cost model (`gmi_drl.gmi.cost`, GMI-DRL Tables 3-5) applied to measured points: its
predictions per template beside what was measured."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from gmi_drl.gmi import cost
from gmi_drl.tune.search import Point


def point_terms(point: Point, device_cores: int, gmis: int | None = None) -> cost.Terms:
    """Table 3's terms from a measured point, resource sizes as fractions of ``device_cores``
    (the probe measures them as CPU cores in use); ``gmis``: the system's GMI count for the
    allreduce term (default the point's)."""
    t = point.terms
    return cost.Terms(t["t_s"], t["t_a"], t["t_t"], t["r_s"] / device_cores,
                      t["r_a"] / device_cores, t["r_t"] / device_cores, t["state_bytes"],
                      t["action_bytes"], t["reward_bytes"], t["model_bytes"], t["samples"],
                      gmis or point.gmis)


def predict(reference: Point, gmis: int, device_cores: int, bw_bytes_per_s: float | None
            ) -> dict[tuple[str, str], float]:
    """The cost model's throughput (env steps/s) of ``gmis`` GMIs on one device, per template
    and variant, from the terms of ``reference``: one GMI measured alone (equation 1's
    condition).

    Variant ``paper``: Tables 4-5 as printed, ``R`` of each unit from the roles' sizes measured
    alone, ``min(gmis, 1/R)`` units at once. Variant ``share`` (co-located templates): every GMI
    holds ``1/gmis`` of the device as Algorithm 2 splits it, each role's time stretched where it
    needed more (`cost.scaled_to_share`). TCG is serving (each GMI's rollout), TCG_EX holistic
    training; TDG and TDG_EX need a bandwidth between GMIs (``None``: not predicted).
    """
    samples = reference.terms["samples"]
    base = point_terms(reference, device_cores, gmis)
    per_step = samples / reference.num_envs  # serving steps of the batch per iteration
    out = {}
    for template in cost.CostTemplate:
        dedicated = template in (cost.CostTemplate.TDG, cost.CostTemplate.TDG_EX)
        if dedicated and not bw_bytes_per_s:
            continue
        variants = {"paper": base}
        if not dedicated:
            variants["share"] = cost.scaled_to_share(base, 1.0 / gmis)
        for variant, terms in variants.items():
            scale = samples
            if template is cost.CostTemplate.TDG:  # Table 4 counts one serving step
                n = reference.num_envs
                terms = dataclasses.replace(terms, t_s=terms.t_s / per_step,
                                            t_a=terms.t_a / per_step,
                                            state_bytes=terms.state_bytes * n,
                                            action_bytes=terms.action_bytes * n,
                                            reward_bytes=terms.reward_bytes * n)
                scale = n
            r = cost.resource_size(template, terms)
            units = min(float(gmis), 1.0 / r) if r > 0 else float(gmis)
            rate = cost.throughput(template, terms, bw_bytes_per_s or math.inf,
                                   r_all=units * r)
            out[(template.value, variant)] = rate * scale
    return out


@dataclass(frozen=True)
class Prediction:
    """The cost model's throughput for one template and GMI count beside the measured one
    (env steps/s; ``measured`` None where gmi-drl runs no such template)."""

    template: str
    variant: str
    """``paper`` (Tables 4-5 as printed) or ``share`` (GMIs of an even share: `predict`)"""
    gmis: int
    predicted: float
    measured: float | None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        return None if not self.measured else (self.predicted - self.measured) / self.measured


def measured_rates(point: Point) -> dict[str, float]:
    """What a sync_training point measured, per template of the model: ``tcg`` the serving
    rate of its GMIs (env steps per second of rollout, every GMI at once), ``tcg_ex`` its
    training throughput."""
    t = point.terms
    return {"tcg": point.gmis * t["samples"] / (t["t_s"] + t["t_a"]), "tcg_ex": point.top}


def compare(reference: Point, points: Sequence[Point], device_cores: int,
            bw_bytes_per_s: float | None) -> list[Prediction]:
    """`predict` from ``reference`` (one GMI alone) for the GMI count of every runnable point
    in ``points`` (same num_envs), beside what each measured."""
    out = []
    for point in sorted((p for p in points if p.runnable), key=lambda p: p.gmis):
        got = measured_rates(point)
        for (template, variant), value in predict(reference, point.gmis, device_cores,
                                                  bw_bytes_per_s).items():
            out.append(Prediction(template, variant, point.gmis, value, got.get(template)))
    return out
