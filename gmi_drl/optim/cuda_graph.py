"""`GraphedStep`: a whole gradient step replayed as one CUDA graph.

A small network's gradient step on a GPU is a few dozen kernels of microseconds each; launching
them from Python (and the compiled wrapper's guards) costs more than running them. Captured once
per minibatch shape into a `torch.cuda.CUDAGraph`, the step becomes the copies of the minibatch
into static input buffers and one ``replay``: the same kernels, launched by the driver.

What the step mutates (the flat weights, the optimizer's moments, step count and learning
rate) lives at fixed addresses, so the graph reads and writes the live tensors: an ``lr`` set
between steps (in place, `gmi_drl.optim.flat`) and a ``load_state_dict`` are seen by the next
replay. Capture needs warm-up runs of the step (cuBLAS workspaces, the compiled kernels'
first launch); they would be real steps, so the weights, the optimizer state and the CUDA
generator's state are saved before them and restored before the capture, which executes
nothing. The replay after it is the caller's step. Captures in one process take turns, each on
a stream of its own.

Source: PyTorch's CUDA graphs (``torch.cuda.graph``; the whole-network capture of the CUDA
semantics notes); the rationale as in CleanRL's and LeanRL's CUDA-graph variants of DQN/TD3.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch

WARMUP_RUNS = 3
"""runs of the step on a side stream before its capture (PyTorch's notes use 3 for DDP)"""

_CAPTURE_LOCK = threading.Lock()
"""one capture at a time per process: torch's capture context synchronises the device, which
would break a capture under way in another thread (GMIs that are threads of one process)"""

MAX_GRAPHS = 16
"""graphs one step keeps (each holds its own memory pool); minibatches of further shapes run
uncaptured"""


class CaptureError(RuntimeError):
    """A step could not be captured (an op that syncs with the host or allocates on the CPU,
    another thread's device-wide sync): its warm-up runs are undone and the thread is back on
    its own stream, so the caller can run the step uncaptured."""


Signature = tuple[tuple[tuple[int, ...], torch.dtype, torch.device], ...]


class GraphedStep:
    """``fn(*batch) -> tuple of tensors`` replayed as one CUDA graph per minibatch signature.

    Args:
        fn: the step; reads ``batch`` and mutates only tensors that ``save``/``restore`` cover
            (weights, optimizer state). Its outputs must be tensors on the batch's device.
        save: ``() -> state``, a copy of what ``fn`` mutates. restore: ``(state) -> None``,
            written back in place (the graph holds the addresses).

    Raises:
        CaptureError: from `__call__` when a capture fails (see there). Anything raised after
            a replay (out of memory in a copy, say) is raised as it is: that step was taken.
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
        device = batch[0].device
        inputs = tuple(torch.empty_like(b).copy_(b) for b in batch)
        state, rng = self.save(), torch.cuda.get_rng_state(device)
        home = torch.cuda.current_stream(device)
        with _CAPTURE_LOCK:
            try:
                side = torch.cuda.Stream(device=device)  # this capture's own (torch's is shared)
                side.wait_stream(home)
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_RUNS):
                        self.fn(*inputs)
                home.wait_stream(side)
                self._undo(state, rng, device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
                    outputs = tuple(self.fn(*inputs))
            except Exception as e:  # noqa: BLE001 - any failure: undo, then name it
                # torch's capture context leaves its stream current when capture_end raises
                torch.cuda.set_stream(home)
                with contextlib.suppress(RuntimeError):
                    torch.cuda.synchronize(device)
                self._undo(state, rng, device)
                first = str(e).splitlines()[0] if str(e) else ""
                raise CaptureError(f"{type(e).__name__}: {first}") from e
            finally:
                torch.cuda.set_stream(home)
        return graph, inputs, outputs

    def _undo(self, state, rng: torch.Tensor, device: torch.device) -> None:
        """Weights, optimizer state and the CUDA generator as before the warm-up runs."""
        self.restore(state)
        torch.cuda.set_rng_state(rng, device)
