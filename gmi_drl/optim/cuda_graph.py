"""`GraphedStep`: a whole gradient step replayed as one CUDA graph.

A small network's gradient step on a GPU is a few dozen kernels of microseconds each; launching
them from Python (and the compiled wrapper's guards) costs more than running them. Captured once
per minibatch shape into a `torch.cuda.CUDAGraph`, the step becomes the copies of the minibatch
into static input buffers and one ``replay``: the same kernels, launched by the driver.

What the step mutates (the flat weights, the optimizer's moments, step count and learning
rate) lives at fixed addresses, so the graph reads and writes the live tensors: an ``lr`` set
between steps (in place, `gmi_drl.optim.flat`) and a ``load_state_dict`` are seen by the next
replay. Capture needs warm-up runs of the step (cuBLAS workspaces, the compiled kernels'
first launch); they would be real steps, so the weights and the optimizer state are saved
before them and restored before the capture, which executes nothing. The replay after it is the
caller's step.

Source: PyTorch's CUDA graphs (``torch.cuda.graph``; the whole-network capture of the CUDA
semantics notes); the rationale as in CleanRL's and LeanRL's CUDA-graph variants of DQN/TD3.
"""

from __future__ import annotations

from typing import Callable

import torch

WARMUP_RUNS = 3
"""runs of the step on a side stream before its capture (PyTorch's notes use 3 for DDP)"""

MAX_GRAPHS = 16
"""graphs one step keeps (each holds its own memory pool); minibatches of further shapes run
uncaptured"""

Signature = tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]


class GraphedStep:
    """``fn(*batch) -> tuple of tensors`` replayed as one CUDA graph per minibatch signature.

    Args:
        fn: the step; reads ``batch`` and mutates only tensors that ``save``/``restore`` cover
            (weights, optimizer state). Its outputs must be tensors on the batch's device.
        save: ``() -> state``, a copy of what ``fn`` mutates. restore: ``(state) -> None``,
            written back in place (the graph holds the addresses).

    Raises:
        RuntimeError: from `__call__` when capture fails (an op that syncs with the host or
            allocates on the CPU); the state is restored first, so the caller can run ``fn``
            uncaptured instead.
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], save: Callable[[], object],
                 restore: Callable[[object], None]) -> None:
        self.fn, self.save, self.restore = fn, save, restore
        self._graphs: dict[Signature, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...],
                                            tuple[torch.Tensor, ...]]] = {}

    @property
    def num_graphs(self) -> int:
        """graphs captured so far (one per minibatch signature)"""
        return len(self._graphs)

    def __call__(self, *batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step on ``batch``; returns ``fn``'s outputs as fresh tensors (the graph's own
        outputs are overwritten by the next replay)."""
        key = tuple((tuple(b.shape), b.dtype, b.device) for b in batch)
        entry = self._graphs.get(key)
        if entry is None:
            if len(self._graphs) >= MAX_GRAPHS:
                return tuple(self.fn(*batch))
            entry = self._capture(batch)
            self._graphs[key] = entry
        graph, inputs, outputs = entry
        for static, b in zip(inputs, batch):
            static.copy_(b, non_blocking=True)
        graph.replay()
        return tuple(o.clone() for o in outputs)

    def _capture(self, batch):
        inputs = tuple(torch.empty_like(b).copy_(b) for b in batch)
        state = self.save()
        try:
            side = torch.cuda.Stream(device=inputs[0].device)
            side.wait_stream(torch.cuda.current_stream(inputs[0].device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self.fn(*inputs)
            torch.cuda.current_stream(inputs[0].device).wait_stream(side)
            self.restore(state)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = tuple(self.fn(*inputs))
        except Exception:
            torch.cuda.synchronize(inputs[0].device)
            self.restore(state)
            raise
        return graph, inputs, outputs
