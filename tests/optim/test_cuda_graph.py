"""Gradient steps replayed as CUDA graphs (`gmi_drl.optim.cuda_graph`): the same weights as the
compiled steps they capture, with annealed learning rates, loaded states and several minibatch
shapes; a capture that fails undoes its warm-up steps. On a CPU the option is ignored."""

import logging

import gymnasium as gym
import pytest
import torch

from gmi_drl.optim.cuda_graph import CaptureError
from gmi_drl.optim.grad_step import GradStep
from tests.optim.test_grad_step import LOSS, _minibatches, _model, _OtherMember

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs a CUDA device (CPU build of torch or no driver here)")


def _steps(space, optimizer, reducer, graphs, device="cuda"):
    model = _model(space).to(device)
    return GradStep(model, LOSS, 1e-2, 0.5, 1e-5, _OtherMember() if reducer else None,
                    compile=True, optimizer=optimizer, cuda_graphs=graphs)


def test_cuda_graphs_are_ignored_on_a_cpu():
    space = gym.spaces.Discrete(4)
    step = _steps(space, "adam", None, True, device="cpu")
    for mb in _minibatches(space, 2):
        step(*mb)
    assert step._graphed is None and step.fused


@pytest.mark.parametrize("error", [CaptureError("RuntimeError: not permitted when capturing"),
                                   RuntimeError("CUDA out of memory")])
def test_only_a_failed_capture_falls_back_and_no_step_is_taken_twice(error, caplog):
    """A capture failure (warm-up undone) runs the step uncaptured; an error after a replay
    (which took the step) is raised as it is, not retried."""
    space = gym.spaces.Discrete(4)
    step = _steps(space, "adam", None, False, device="cpu")
    mb = _minibatches(space, 1)[0]
    step(*mb)  # compiles

    class Failing:
        def __call__(self, *batch):
            if not isinstance(error, CaptureError):
                step._compiled(*batch)  # the replay's step, then a failure
            raise error

    step._graphed = Failing()
    with caplog.at_level(logging.WARNING):
        if isinstance(error, CaptureError):
            step(*mb)
            assert "capture of the gradient step failed (RuntimeError: not permitted" in \
                caplog.text
            assert step._graphed is None
        else:
            with pytest.raises(RuntimeError, match="out of memory"):
                step(*mb)
    assert step.optimizer.steps == 2


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("space,optimizer", [(gym.spaces.Box(-1, 1, (3,)), "adam"),
                                             (gym.spaces.Discrete(4), "rmsprop_tf")])
@pytest.mark.parametrize("reducer", [None, "group"])
def test_graphed_steps_equal_compiled_steps(space, optimizer, reducer):
    plain = _steps(space, optimizer, reducer, graphs=False)
    graphed = _steps(space, optimizer, reducer, graphs=True)
    batches = [tuple(t.cuda() for t in mb)
               for mb in _minibatches(space, 4) + _minibatches(space, 4, m=16)]
    expected, kept = [], []
    for i, mb in enumerate(batches):
        if i == 3:
            plain.lr = graphed.lr = 5e-3  # written in place: the captured graph reads it
        if i == 5:  # a loaded state (other weights and moments) lands where the graph reads it
            state = plain.state_dict()
            data = plain.params.data * 0.5
            for step in (plain, graphed):
                step.load_state_dict(state)
                step.params.data.copy_(data)
                step.lr = 2e-3
        expected.append(plain(*mb))
        kept.append(graphed(*mb))
    # every step's outputs, compared at the end: a later replay did not overwrite them
    for a, b in zip(expected, kept):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain.params.data, graphed.params.data, rtol=1e-5, atol=1e-6)
    assert graphed._graphed is not None and graphed._graphed.num_graphs == 2  # m = 32 and 16
    assert graphed.optimizer.steps == plain.optimizer.steps == len(batches)


@pytest.mark.gpu
@cuda
def test_shapes_past_the_graph_limit_run_uncaptured(monkeypatch):
    import gmi_drl.optim.cuda_graph as cg

    monkeypatch.setattr(cg, "MAX_GRAPHS", 1)
    space = gym.spaces.Discrete(4)
    plain = _steps(space, "adam", None, graphs=False)
    graphed = _steps(space, "adam", None, graphs=True)
    for m in (32, 16, 32, 16):
        mb = tuple(t.cuda() for t in _minibatches(space, 1, m=m)[0])
        torch.testing.assert_close(plain(*mb), graphed(*mb), rtol=1e-5, atol=1e-6)
    assert graphed._graphed.num_graphs == 1
    torch.testing.assert_close(plain.params.data, graphed.params.data, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@cuda
def test_a_failed_capture_undoes_its_warm_up_steps(monkeypatch, caplog):
    import gmi_drl.optim.cuda_graph as cg

    class Refused:
        def __init__(self, graph, **kw):
            pass

        def __enter__(self):
            raise RuntimeError("operation not permitted when stream is capturing")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(cg.torch.cuda, "graph", Refused)
    space = gym.spaces.Discrete(4)
    plain = _steps(space, "adam", None, graphs=False)
    graphed = _steps(space, "adam", None, graphs=True)
    with caplog.at_level(logging.WARNING):
        for mb in _minibatches(space, 3):
            mb = tuple(t.cuda() for t in mb)
            plain(*mb)
            graphed(*mb)
    assert "CUDA graph capture of the gradient step failed (RuntimeError" in caplog.text
    assert graphed._graphed is None
    assert torch.cuda.current_stream() == torch.cuda.default_stream()  # back on its stream
    assert graphed.optimizer.steps == plain.optimizer.steps == 3  # no warm-up step kept
    torch.testing.assert_close(plain.params.data, graphed.params.data, rtol=1e-5, atol=1e-6)
