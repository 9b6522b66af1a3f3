"""Gradient reduction among trainers: `reducer.GradReducer`, its implementations, the one
`reduction.Reduction` choice and Algorithm 1.

Kept free of torch at import time (the switch daemon needs none of it).
"""

from gmi_drl.comm.reduction import Reduction, select_reduction

__all__ = ["Reduction", "select_reduction"]
