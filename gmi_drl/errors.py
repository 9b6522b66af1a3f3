"""Failures told in one line: what a user reads first when a GMI or an env worker raised."""

from __future__ import annotations

import math
import re


LOG_FILE_ONLY = {"gmi_drl_log_file_only": True}
"""``extra=`` of a log record for ``train.log`` alone (a traceback), kept off the terminal by
the CLI unless ``--debug`` (`terminal_filter`)"""


def terminal_filter(record) -> bool:
    """A terminal handler's filter: False for `LOG_FILE_ONLY` records."""
    return not getattr(record, "gmi_drl_log_file_only", False)


def exception_line(tb: str) -> str:
    """The exception of a formatted traceback, in one line (``"EnvWorkerError: ..."``): the
    first line after the frames of the last ``Traceback`` header (the exception raised last),
    its class without the module path.

    ``tb``: what `traceback.format_exc` wrote (or any text; its first line then).
    """
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    if not lines:
        return "an error"
    headers = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call")]
    i = headers[-1] + 1 if headers else 0
    while i < len(lines) - 1 and lines[i][0].isspace():
        i += 1
    return re.sub(r"^[\w.]+\.(\w+)(?=:|$)", r"\1", lines[i].strip())


class TrainingDiverged(RuntimeError):
    """The weights (or the losses) became NaN or infinite: every update after would be NaN
    too, so the run stops instead of training and checkpointing garbage."""


def check_finite(modules: dict, global_step: int, losses: dict | None = None) -> None:
    """Raise `TrainingDiverged` when a weight of ``modules`` (``{name: state_dict}``) or a loss
    of ``losses`` (``{"losses/NAME": value}``; the ``*_loss``, ``entropy`` and ``q_values``
    entries, not ratios such as ``explained_variance`` that are NaN by definition at times)
    is NaN or infinite.

    Raises:
        TrainingDiverged: naming the first such tensor and every such loss, at ``global_step``.
    """
    import torch

    bad_losses = [f"{k.removeprefix('losses/')}={float(v)}" for k, v in (losses or {}).items()
                  if k.startswith("losses/") and (k.endswith("_loss") or k in (
                      "losses/entropy", "losses/q_values")) and not math.isfinite(float(v))]
    bad_weight = next((f"{name}.{key}" for name in sorted(modules)
                       for key, t in modules[name].items()
                       if torch.is_tensor(t) and t.is_floating_point()
                       and not bool(torch.isfinite(t).all())), None)
    if bad_losses or bad_weight:
        what = (([f"weight {bad_weight} is NaN or infinite"] if bad_weight else [])
                + ([f"losses {', '.join(bad_losses)}"] if bad_losses else []))
        raise TrainingDiverged(
            f"training diverged by env step {global_step:,}: {'; '.join(what)}. Updates after "
            "it would stay NaN, so the run stopped; no checkpoint holds these weights. Lower "
            "--algo.learning-rate or --algo.max-grad-norm, or check the task's rewards and "
            "observations for NaN or huge values, then start a new run")


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says memory ran out: a `MemoryError`, torch's CPU allocator ("can't
    allocate memory") or CUDA's ("out of memory"), raised here or reported from a GMI (its
    message holds the GMI's exception line)."""
    text = getattr(e, "exception", None)  # a GMI's failure: its exception's line alone (its
    if not isinstance(text, str):  # traceback may mention memory in a chained exception)
        text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or any(s in text for s in ("can't allocate memory", "CUDA out of memory",
                                       "MemoryError")))
