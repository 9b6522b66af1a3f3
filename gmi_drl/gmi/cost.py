"""The template cost model of the GMI-DRL paper (§5.1, Tables 3-5, equations 1-3).

A template maps the roles of DRL (simulator, agent, trainer) onto GMIs. For each template the
model gives the resource size ``R`` one unit of work occupies and the bytes ``COM`` it moves
between GMIs per iteration; the system's throughput is then (equations 2 and 3)

    TOP = (R_all / R) * 1 / (sum of the role times + COM / BW)        iterations per second

Serving (Table 4): ``TDG`` puts simulator and agent in dedicated GMIs, ``TCG`` co-locates them.
Synchronous training (Table 5): ``TDG_EX`` adds dedicated trainer GMIs, ``TCG_EX`` is the holistic
GMI (simulator + agent + trainer, gmi-drl's ``sync_training`` template). ``Terms`` holds Table 3's
terms as measured quantities; `gmi_drl.tune` measures them from short real runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CostTemplate(str, enum.Enum):
    """The four mappings of Tables 4 and 5."""

    TDG = "tdg"  # serving, simulator and agent in dedicated GMIs
    TCG = "tcg"  # serving, simulator + agent in one GMI
    TDG_EX = "tdg_ex"  # sync training, dedicated simulator, agent and trainer GMIs
    TCG_EX = "tcg_ex"  # sync training, holistic GMIs

    @property
    def trains(self) -> bool:
        return self in (CostTemplate.TDG_EX, CostTemplate.TCG_EX)


@dataclass(frozen=True)
class Terms:
    """Table 3's terms, measured.

    Times are seconds per iteration (one serving step of the batch for Table 4, one training
    iteration for Table 5); resource sizes are fractions of one device's dominant resource
    (`dominant_resource`); sizes are bytes.
    """

    t_s: float
    """simulator seconds per iteration (T_s)"""
    t_a: float
    """agent (policy inference) seconds per iteration (T_a)"""
    t_t: float = 0.0
    """trainer seconds per iteration (T_t; 0 for serving)"""
    r_s: float = 1.0
    """simulator's dominant-resource size (R_s), fraction of a device"""
    r_a: float = 1.0
    """agent's dominant-resource size (R_a)"""
    r_t: float = 1.0
    """trainer's dominant-resource size (R_t)"""
    state_bytes: float = 0.0
    """S: one state (observation) vector, bytes"""
    action_bytes: float = 0.0
    """A: one action vector, bytes"""
    reward_bytes: float = 0.0
    """W: one reward, bytes"""
    model_bytes: float = 0.0
    """M_p: the policy model (every parameter), bytes"""
    steps: float = 1.0
    """m: simulation steps (one state, action and reward each) per iteration"""
    num_gmis: int = 1
    """n: GMIs in the whole system (for the allreduce term)"""
    alpha: float = 1.0
    """size ratio when several simulators share one agent (alpha; paper: about 0.2)"""
    beta: float = 1.0
    """size ratio when several simulators share one trainer (beta; paper: about 0.3)"""

    @property
    def time_s(self) -> float:
        """T_s + T_a (+ T_t): the role times of one iteration, seconds."""
        return self.t_s + self.t_a + self.t_t


def dominant_resource(sm: float, sm_per_device: float, mem: float,
                      mem_per_device: float) -> str:
    """Equation 1: ``"sm"`` when compute is the larger share of a device, else ``"memory"``.

    ``sm``/``mem``: what one process running alone on a device uses (SMs, or CPU cores on a CPU
    device; bytes); ``*_per_device``: what the device has.

    Raises:
        ValueError: a device total that is not positive.
    """
    if sm_per_device <= 0 or mem_per_device <= 0:
        raise ValueError(f"device totals must be > 0 (got {sm_per_device}, {mem_per_device})")
    return "sm" if sm / sm_per_device >= mem / mem_per_device else "memory"


def resource_size(template: CostTemplate, t: Terms) -> float:
    """R of one unit of ``template`` (Tables 4 and 5, column "Resource Size"), fraction of a
    device: dedicated GMIs weight each role's size by its share of the time, co-located ones
    hold the largest role's size for the whole iteration."""
    if template is CostTemplate.TDG:
        return (t.t_s * t.r_s + t.t_a * t.alpha * t.r_a) / (t.t_s + t.t_a)
    if template is CostTemplate.TCG:
        return max(t.r_s, t.r_a)
    if template is CostTemplate.TDG_EX:
        return ((t.t_s * t.r_s + t.t_a * t.alpha * t.r_a + t.t_t * t.beta * t.r_t)
                / t.time_s)
    return max(t.r_s, t.r_a, t.r_t)


def allreduce_bytes(model_bytes: float, num_gmis: int) -> float:
    """Bytes each GMI sends in a bandwidth-optimal allreduce of ``model_bytes``:
    ``2 (n - 1) M_p / n`` (0 for one GMI)."""
    return 2.0 * (num_gmis - 1) * model_bytes / num_gmis if num_gmis > 1 else 0.0


def comm_bytes(template: CostTemplate, t: Terms) -> float:
    """COM of ``template`` (Tables 4 and 5, column "Comm. Size"), bytes per iteration."""
    if template is CostTemplate.TDG:
        return 2 * t.state_bytes + t.action_bytes + t.reward_bytes
    if template is CostTemplate.TCG:
        return 0.0
    reduce = allreduce_bytes(t.model_bytes, t.num_gmis)
    if template is CostTemplate.TDG_EX:
        return (t.steps * (t.state_bytes + t.action_bytes + t.reward_bytes) + t.model_bytes
                + reduce)
    return reduce


def throughput(template: CostTemplate, t: Terms, bw_bytes_per_s: float,
               r_all: float = 1.0) -> float:
    """Equations 2 (serving) and 3 (training): iterations per second of the whole system,
    ``(r_all / R) / (T + COM / BW)``.

    Args:
        template: the mapping.
        t: the measured terms (``t.num_gmis`` sets the allreduce's ``n``).
        bw_bytes_per_s: BW, bytes per second of the path between GMIs (``inf``: free).
        r_all: R_all, the dominant resource of the whole system in devices (1 per device).

    Raises:
        ValueError: a non-positive bandwidth, resource size or iteration time.
    """
    if bw_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s (got {bw_bytes_per_s})")
    r = resource_size(template, t)
    seconds = (t.t_s + t.t_a + (t.t_t if template.trains else 0.0)
               + comm_bytes(template, t) / bw_bytes_per_s)
    if r <= 0 or seconds <= 0:
        raise ValueError(f"resource size ({r}) and iteration time ({seconds} s) must be > 0")
    return (r_all / r) / seconds


def scaled_to_share(t: Terms, share: float) -> Terms:
    """``t`` measured on a whole device, re-sized to a GMI holding ``share`` of it: a role that
    used more than the share runs slower by ``R / share`` and then holds just the share, one
    that used less keeps its time and size. Equation 3 with these terms (R the GMI's share)
    is the model of a device split evenly into GMIs, as Algorithm 2 splits it; the plain terms
    with ``R = max(R_s, R_a, R_t)`` (Table 5) assume each GMI is sized for its largest role.

    Raises:
        ValueError: ``share`` not in (0, 1].
    """
    if not 0 < share <= 1:
        raise ValueError(f"share={share} must be in (0, 1]")

    def stretch(seconds: float, r: float) -> float:
        return seconds * max(1.0, r / share)

    return Terms(stretch(t.t_s, t.r_s), stretch(t.t_a, t.r_a), stretch(t.t_t, t.r_t),
                 min(t.r_s, share), min(t.r_a, share), min(t.r_t, share), t.state_bytes,
                 t.action_bytes, t.reward_bytes, t.model_bytes, t.steps, t.num_gmis, t.alpha,
                 t.beta)
