"""Measured points kept in a JSON file, so that an interrupted search resumes where it stopped
and a second search of the same job on the same machine measures nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import warnings
from pathlib import Path

from gmi_drl.files import write_text_atomically
from gmi_drl.tune.search import Point


CACHE_VERSION = 3
"""bumped when a point's meaning or the file's layout changes, so older cache files are not
reused (2: windows of at least ``min_seconds`` judged from the nearest point measured; 3: the
points of every key in one file, and M_p of the trained networks only)"""


class PointCache:
    """Measured points in a JSON file, under a key of everything that changes a measurement
    (the config less num_envs and GMIs, the probe length, the device); written after every
    point. Points of other keys in the file (other jobs tuned into the same ``--out``) are kept.
    A file that is not a cache (unreadable, or edited into another shape) is kept beside it as
    ``NAME.bad`` and the search starts afresh, with a warning; an entry that is not a whole
    runnable point is measured again.

    Args:
        path: the cache file.
        key: this search's key.
        fresh: start this key's points afresh (the file's other keys are kept).
    """

    def __init__(self, path: Path, key: str, fresh: bool = False) -> None:
        self.path, self.key = Path(path), key
        self.entries: dict[str, dict] = {}
        if self.path.exists() or self.path.is_symlink():
            self.entries = self._read()
        if fresh or not isinstance(self.entries.get(key), dict):
            self.entries[key] = {}
        self.points: dict[str, dict] = self.entries[key]

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            return self._set_aside(f"it does not read as JSON ({e})")
        if not isinstance(data, dict):
            return self._set_aside("it holds no cache object")
        if data.get("version") != CACHE_VERSION:
            return {}  # an older gmi-drl's points mean something else: measured again
        entries = data.get("entries")
        if not isinstance(entries, dict):
            return self._set_aside("it has no 'entries' object")
        return entries

    def _set_aside(self, why: str) -> dict:
        bad = self.path.with_name(self.path.name + ".bad")
        try:
            os.replace(self.path, bad)
        except OSError as e:
            raise OSError(f"{self.path} is not a tune cache ({why}) and cannot be moved "
                          f"aside ({e}): move or delete it") from None
        warnings.warn(f"{self.path} is not a tune cache ({why}); kept as {bad}, every point "
                      "is measured again", stacklevel=3)
        return {}

    def get(self, gmis: int, num_envs: int) -> Point | None:
        """The cached point, or ``None`` (also for an entry that is not a whole runnable point
        of these GMIs and num_envs, e.g. edited by hand: it is measured again)."""
        data = self.points.get(f"{gmis},{num_envs}")
        try:
            point = Point(**{**data, "cached": True, "sat": None, "estimate": None})
        except TypeError:  # None, not a dict, or other fields
            return None
        whole = (point.runnable is True and point.gmis == gmis and point.num_envs == num_envs
                 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                         and 0 < v < math.inf for v in (point.top, point.mem))
                 and isinstance(point.terms, dict)
                 and all(isinstance(v, (int, float)) for v in point.terms.values()))
        return point if whole else None

    def put(self, point: Point) -> None:
        data = dataclasses.asdict(point)
        for transient in ("cached", "sat", "estimate"):
            data.pop(transient)
        self.points[f"{point.gmis},{point.num_envs}"] = data
        write_text_atomically(self.path, json.dumps({"version": CACHE_VERSION,
                                                     "entries": self.entries}, indent=1))


def cache_key(config: dict, warmup: int, iterations: int, machine: str,
              min_steps: int = 0, min_seconds: float = 0.0) -> str:
    """A digest of what changes a measured point."""
    data = json.loads(json.dumps(config))
    data["env"].pop("num_envs", None)
    data["gmi"].pop("num_gmis", None)
    for volatile in ("run_dir", "preset", "resume", "config", "total_timesteps"):
        data.pop(volatile, None)
    text = json.dumps([data, warmup, iterations, min_steps, machine]
                      + ([min_seconds] if min_seconds else []), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
