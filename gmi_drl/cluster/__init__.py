"""Ray scale-out: the GMIs of a layout as Ray actors (DESIGN.md §3, `cluster/`).

Not needed for local runs: nothing here is imported unless ``--placement ray`` is chosen.
"""
