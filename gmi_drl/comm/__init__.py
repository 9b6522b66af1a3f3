"""Gradient reduction among trainers: `reducer.GradReducer` and its strategies, Algorithm 1.

Kept free of torch at import time (the switch daemon needs none of it).
"""

from gmi_drl.comm.strategy import Strategy, select_strategy

__all__ = ["Strategy", "select_strategy"]
