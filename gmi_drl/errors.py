"""Failures told in one line: what a user reads first when a GMI or an env worker raised."""

from __future__ import annotations

import re


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
