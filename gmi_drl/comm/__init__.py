"""Gradient reduction among trainers: the `GradReducer` interface, its strategies, Algorithm 1."""

from gmi_drl.comm.reducer import GradReducer, IdentityReducer
from gmi_drl.comm.strategy import Strategy, select_strategy

__all__ = ["GradReducer", "IdentityReducer", "Strategy", "select_strategy"]
