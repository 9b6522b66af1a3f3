"""One file per algorithm: its config, loss and learner; gradients leave through a `GradReducer`."""

from gmi_drl.algos.ppo import PPO, PPOConfig, PPOLoss, approx_kl, clip_fraction, ppo_loss
from gmi_drl.comm.reducer import GradReducer, IdentityReducer

__all__ = ["PPO", "GradReducer", "IdentityReducer", "PPOConfig", "PPOLoss", "approx_kl",
           "clip_fraction", "ppo_loss"]
