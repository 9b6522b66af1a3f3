"""Ray scale-out: the GMIs of a layout as Ray actors (docs/ray.md).

Not needed for local runs: nothing here is imported unless ``--placement ray`` is chosen.
"""
