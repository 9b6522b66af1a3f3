"""Metric sinks: ``metrics.csv`` (long format) and TensorBoard, both keyed by ``global_step``."""

from __future__ import annotations

import csv
import time
from pathlib import Path


HEADER = ["global_step", "wall_s", "name", "value"]
"""the columns of ``metrics.csv``"""


class MetricsWriter:
    """Append scalar metrics to ``<run_dir>/metrics.csv`` and, optionally, TensorBoard events.

    CSV columns: ``global_step, wall_s, name, value`` (one row per metric; ``wall_s`` = seconds
    since this writer opened). Appends when the file exists (resumed runs).

    Args:
        run_dir: the run directory. tensorboard: also write event files into it.
        purge_step: the ``global_step`` a resumed run continues from: CSV rows after it are
            dropped, as TensorBoard's ``purge_step`` drops events (the updates a crashed run made
            after its last checkpoint are made again).
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True,
                 purge_step: int | None = None) -> None:
        path = Path(run_dir) / "metrics.csv"
        if purge_step is not None and path.exists():
            _drop_rows_after(path, purge_step)
        new = not path.exists() or path.stat().st_size == 0  # empty: a killed writer's
        self._file = open(path, "a", newline="")
        self._csv = csv.writer(self._file)
        if new:
            self._csv.writerow(HEADER)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard purges events at purge_step and after; the row at the checkpoint's
            # own step was logged before it and is kept, as in the CSV
            self._tb = SummaryWriter(str(run_dir), purge_step=None if purge_step is None
                                     else purge_step + 1)
        self._t0 = time.perf_counter()

    def log(self, global_step: int, metrics: dict[str, float]) -> None:
        """Write every ``name: value`` at ``global_step``; the CSV rows reach the file at once
        (a live run can be followed or plotted from it; TensorBoard flushes on its own)."""
        wall = round(time.perf_counter() - self._t0, 3)
        for name, value in metrics.items():
            self._csv.writerow([global_step, wall, name, f"{value:.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(name, value, global_step)
        self._file.flush()

    def flush(self) -> None:
        self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _drop_rows_after(path: Path, global_step: int) -> None:
    """Keep the header and the rows of ``path`` up to ``global_step`` (a header that a
    killed run never wrote is added; a row cut off mid-write is dropped)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    data = rows[1:] if rows[:1] == [HEADER] else rows
    kept = [r for r in data if len(r) == len(HEADER) and r[0].isdigit()
            and int(r[0]) <= global_step]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([HEADER, *kept])
