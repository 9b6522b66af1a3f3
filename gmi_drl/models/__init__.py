"""Neural networks only: MLPs from layer strings, the Nature CNN, actor-critic heads."""

from gmi_drl.models.actor_critic import ActorCritic, ActResult, EvalResult, build_actor_critic
from gmi_drl.models.cnn import NatureCNN
from gmi_drl.models.mlp import MLP, parse_layers

__all__ = ["ActResult", "ActorCritic", "EvalResult", "MLP", "NatureCNN", "build_actor_critic",
           "parse_layers"]
