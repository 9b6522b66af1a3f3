"""iSwitch: in-network gradient aggregation by a userspace switch daemon (DESIGN §6).

- `protocol`: every packet format (control: Action + Value; data: Seg header + float32).
- `daemon`: `SwitchDaemon`, the switch (control plane, tree, timers) over a data plane.
- `dataplane`: the data plane (slots, aggregation, results, fault injection): the Python
  reference `PyDataPlane`, or the native one of ``csrc/switch_plane.cpp``.
- `client`: `SwitchReducer`, a worker's `GradReducer` (rounds pipelined with `begin` / `pump`).
- `pipeline`: `StaleSyncPipeline`, stale-sync training: a staleness bound S (§4.1).
- `threshold`: `ThresholdReducer`, `ThresholdPipeline`, Async iSwitch: aggregates of H gradients
  of any workers, staleness bound S (§4.1, Fig. 11).
- `netns`: an emulated rack of network namespaces (root only).
- `cli`: ``python -m gmi_drl.comm.switch serve ...``.
"""

from gmi_drl.comm.switch.client import SwitchReducer
from gmi_drl.comm.switch.daemon import SwitchConfig, SwitchDaemon

__all__ = ["SwitchConfig", "SwitchDaemon", "SwitchReducer"]
