"""Metric sinks: ``metrics.csv`` (long format) and TensorBoard, both keyed by ``global_step``."""

from __future__ import annotations

import csv
import time
from pathlib import Path


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
        new = not path.exists()
        self._file = open(path, "a", newline="")
        self._csv = csv.writer(self._file)
        if new:
            self._csv.writerow(["global_step", "wall_s", "name", "value"])
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir), purge_step=purge_step)
        self._t0 = time.perf_counter()

    def log(self, global_step: int, metrics: dict[str, float]) -> None:
        """Write every ``name: value`` at ``global_step``."""
        wall = round(time.perf_counter() - self._t0, 3)
        for name, value in metrics.items():
            self._csv.writerow([global_step, wall, name, f"{value:.6g}"])
            if self._tb is not None:
                self._tb.add_scalar(name, value, global_step)

    def flush(self) -> None:
        self._file.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _drop_rows_after(path: Path, global_step: int) -> None:
    """Keep the header and the rows of ``path`` up to ``global_step``."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows[:1] + [r for r in rows[1:] if int(r[0]) <= global_step])
