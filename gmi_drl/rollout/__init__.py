"""Rollout storage ``[T, B, ...]``, collectors, normalisers and advantage estimation."""

from gmi_drl.rollout.collector import Collector
from gmi_drl.rollout.episodes import Episodes
from gmi_drl.rollout.gae import compute_gae
from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer, RunningMeanStd
from gmi_drl.rollout.storage import Batch, RolloutBuffer

__all__ = ["Batch", "Collector", "Episodes", "ObsNormalizer", "RewardNormalizer",
           "RolloutBuffer", "RunningMeanStd", "compute_gae"]
