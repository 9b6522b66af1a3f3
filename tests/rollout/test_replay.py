"""The frame replay (each Atari frame stored once) against the naive replay that stores every
stack twice: same transitions after wrap-around, eviction and episode resets; sampling,
checkpoints and bad input; n-step transitions of both against a hand-walked reference."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from gmi_drl import envs
from gmi_drl.envs.spec import EnvSpec
from gmi_drl.rollout.collector import ReplayCollector
from gmi_drl.rollout.replay import FrameReplayBuffer, ReplayBuffer, make_replay


class _Both:
    """Adds every transition to a frame replay and to a naive one."""

    def __init__(self, *buffers):
        self.buffers = buffers

    def add(self, *transition):
        for b in self.buffers:
            b.add(*transition)


def _assert_same(frame: FrameReplayBuffer, naive: ReplayBuffer, index: np.ndarray) -> None:
    got, want = frame.get(index), naive.get(index)
    for name, a, b in zip(want._fields, got, want):
        assert torch.equal(a, b), name


def test_frame_replay_of_an_atari_pool_equals_the_naive_replay_after_wrap_and_resets():
    # short episodes (truncated after 25 steps) put many resets, with stacks of repeated
    # first frames, into the streams; 2 envs x 60 slots wrap after 60 steps
    with envs.make("Pong-v5", num_envs=2, seed=3, autoreset="same_step", img_height=42,
                   img_width=42, max_episode_steps=25) as pool:
        frame = FrameReplayBuffer(120, pool.observation_space, pool.action_space, 2)
        naive = ReplayBuffer(120, pool.observation_space, pool.action_space)
        rng = np.random.default_rng(0)
        policy = lambda obs: (a := rng.integers(0, 6, len(obs)), a)  # noqa: E731
        episodes = ReplayCollector(pool, _Both(frame, naive)).collect(150, policy)
    assert len(episodes.returns) >= 10 and frame.steps == 150
    held = frame.indices()
    assert frame.size == len(held) == 120 and np.array_equal(held, naive.indices())
    _assert_same(frame, naive, held)
    # one frame per step plus a stack per episode, against two stacks per transition
    assert frame.nbytes < naive.nbytes / 4
    # a sample is made of held transitions
    batch = frame.sample(64, torch.Generator().manual_seed(0))
    assert batch.obs.shape == (64, 4, 42, 42) and batch.obs.dtype == torch.uint8
    rows = {(o.numpy().tobytes(), n.numpy().tobytes()) for o, n in
            zip(naive.get(held).obs, naive.get(held).next_obs)}
    assert all((o.numpy().tobytes(), n.numpy().tobytes()) in rows
               for o, n in zip(batch.obs, batch.next_obs))


def _stream(rng, steps, num_envs, stack=3, shape=(2, 2), reset_every=(1, 4)):
    """Frame-stacked transitions with episodes of 1-3 steps and final observations that
    sometimes do not continue their stack (what a naive stacker could get wrong)."""
    obs = rng.integers(0, 255, (num_envs, stack, *shape), np.uint8)
    left = rng.integers(*reset_every, num_envs)
    for _ in range(steps):
        nxt = np.concatenate([obs[:, 1:], rng.integers(0, 255, (num_envs, 1, *shape),
                                                       np.uint8)], 1)
        left -= 1
        done = left == 0
        odd = done & (rng.random(num_envs) < 0.5)
        nxt[odd] = rng.integers(0, 255, (int(odd.sum()), stack, *shape), np.uint8)
        yield obs, rng.integers(0, 5, num_envs), rng.normal(size=num_envs).astype(np.float32), \
            nxt, done & (rng.random(num_envs) < 0.5), done
        obs = nxt.copy()
        if done.any():
            obs[done] = rng.integers(0, 255, (int(done.sum()), stack, *shape), np.uint8)
            left[done] = rng.integers(*reset_every, int(done.sum()))


def test_frame_replay_evicts_transitions_whose_frames_were_overwritten_and_samples_the_rest():
    space = gym.spaces.Box(0, 255, (3, 2, 2), np.uint8)
    frame = FrameReplayBuffer(40, space, gym.spaces.Discrete(5), 2)
    naive = ReplayBuffer(40, space, gym.spaces.Discrete(5))
    rng = np.random.default_rng(1)
    for t in _stream(rng, 100, 2):
        frame.add(*t)
        naive.add(*t)
    held = frame.indices()
    # 1-3 step episodes append up to 3 frames more per reset than the 26 extra slots hold
    assert 0 < frame.size == len(held) < naive.size
    assert set(held) <= set(naive.indices()) and held.max() == naive.indices().max()
    _assert_same(frame, naive, held)
    with pytest.raises(IndexError):
        frame.get(np.setdiff1d(naive.indices(), held)[:1])
    # uniform over the sampleable transitions: all of them drawn, nothing else
    batch = frame.sample(4000, torch.Generator().manual_seed(2))
    want = naive.get(held)
    keys = {o.numpy().tobytes() + n.numpy().tobytes(): i
            for i, (o, n) in enumerate(zip(want.obs, want.next_obs))}
    drawn = [keys[o.numpy().tobytes() + n.numpy().tobytes()]
             for o, n in zip(batch.obs, batch.next_obs)]
    assert sorted(set(drawn)) == list(range(len(held)))


def test_frame_replay_checkpoint_restores_the_same_samples_and_refuses_another_layout(
        tmp_path):
    space = gym.spaces.Box(0, 255, (3, 2, 2), np.uint8)
    spec = EnvSpec("Frames-v0", space, gym.spaces.Discrete(5), None)
    buf = make_replay(50, spec, 2, "cpu")
    assert isinstance(buf, FrameReplayBuffer)
    stream = _stream(np.random.default_rng(3), 60, 2, reset_every=(5, 20))
    for _, t in zip(range(30), stream):
        buf.add(*t)
    saved = tmp_path / "replay.pt"  # through a checkpoint file's safe load (tensors only)
    torch.save(buf.state_dict(), saved)
    restored = make_replay(50, spec, 2, "cpu", torch.load(saved, weights_only=True))
    for t in stream:  # both go on from the same state
        buf.add(*t)
        restored.add(*t)
    a = buf.sample(32, torch.Generator().manual_seed(4))
    b = restored.sample(32, torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="does not fit"):
        make_replay(50, spec, 5, "cpu", buf.state_dict())  # another num_envs
    with pytest.raises(ValueError, match="does not fit"):
        make_replay(50, spec, 2, "cpu", ReplayBuffer(50, space, spec.action_space).state_dict())
    with pytest.raises(ValueError, match="one transition per env"):
        buf.add(*(x[:1] for x in next(_stream(np.random.default_rng(0), 1, 2))))
    with pytest.raises(ValueError, match="empty"):
        FrameReplayBuffer(4, space, spec.action_space, 2).sample(1, torch.Generator())


def test_make_replay_keeps_vectors_and_single_frames_in_the_naive_layout():
    vec = EnvSpec("V-v0", gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2), None)
    one = EnvSpec("F-v0", gym.spaces.Box(0, 255, (1, 8, 8), np.uint8), gym.spaces.Discrete(2),
                  None)
    assert all(type(make_replay(8, s, 2, "cpu")) is ReplayBuffer for s in (vec, one))
    with pytest.raises(ValueError, match="uint8 frame stacks"):
        FrameReplayBuffer(8, vec.observation_space, vec.action_space, 2)


def test_a_resumed_run_refills_its_replay_but_still_trains_when_little_is_left():
    from gmi_drl.rollout.replay import refill_steps

    assert refill_steps(10_000, 1_000_000, 500_000) == 10_000  # as a new run
    assert refill_steps(10_000, 5_000, 500_000) == 5_000  # no more than the buffer holds
    assert refill_steps(10_000, 1_000_000, 10_000) == 5_000  # half of what is left
    assert refill_steps(10_000, 1_000_000, -3) == 0


def _n_step_reference(streams, env, step, n, gamma):
    """The n-step transition ``step`` of ``env``, walked by hand over its list of
    ``(obs, action, reward, next_obs, terminated, done)``: rewards up to ``n`` steps, stopping
    after a step whose episode ended or at the newest step stored."""
    own = streams[env]
    m = 1
    while m < n and step + m < len(own) and not own[step + m - 1][5]:
        m += 1
    ret = sum(gamma ** k * own[step + k][2] for k in range(m))
    obs, action = own[step][0], own[step][1]
    return obs, action, ret, own[step + m - 1][3], float(own[step + m - 1][4]), gamma ** m


@pytest.mark.parametrize("layout", ["naive", "frames"])
@pytest.mark.parametrize("n", [1, 3])
def test_n_step_transitions_sum_discounted_rewards_up_to_episode_ends_and_the_newest_step(
        layout, n):
    space = gym.spaces.Box(0, 255, (3, 2, 2), np.uint8)
    num_envs, gamma = 2, 0.9
    if layout == "frames":
        buf = FrameReplayBuffer(80, space, gym.spaces.Discrete(5), num_envs, n_step=n,
                                gamma=gamma)
    else:  # 41 rows: the streams wrap at a row that is not an env boundary
        buf = ReplayBuffer(41, space, gym.spaces.Discrete(5), n_step=n, gamma=gamma,
                           num_envs=num_envs)
    streams = [[] for _ in range(num_envs)]
    ends = terminations = 0
    for t in _stream(np.random.default_rng(5), 70, num_envs, reset_every=(1, 6)):
        buf.add(*t)
        for e in range(num_envs):
            streams[e].append(tuple(x[e] for x in t))
        ends, terminations = ends + int(t[5].sum()), terminations + int(t[4].sum())
    assert ends > terminations > 5  # truncations and terminations both cut windows
    held = buf.indices()
    assert len(held) > 30
    batch = buf.get(held)
    cut = 0
    for row, index in enumerate(held):
        env, step = int(index % num_envs), int(index // num_envs)
        obs, action, ret, nxt, term, discount = _n_step_reference(streams, env, step, n, gamma)
        np.testing.assert_array_equal(batch.obs[row].numpy(), obs)
        assert int(batch.actions[row]) == int(action)
        assert float(batch.rewards[row]) == pytest.approx(ret, rel=1e-5, abs=1e-6)
        np.testing.assert_array_equal(batch.next_obs[row].numpy(), nxt)
        assert float(batch.terminated[row]) == term
        assert float(batch.discount[row]) == pytest.approx(discount, rel=1e-6)
        cut += discount > gamma ** n * 1.0001
    if n > 1:
        assert 0 < cut < len(held)  # some windows were cut short, most were not
    sampled = buf.sample(16, torch.Generator().manual_seed(0))
    assert sampled.discount.shape == (16,) and sampled.discount.dtype == torch.float32


def test_an_n_step_replay_takes_one_transition_per_env_and_refuses_bad_settings():
    space = gym.spaces.Box(-1, 1, (3,), np.float32)
    buf = ReplayBuffer(10, space, gym.spaces.Discrete(2), n_step=2, num_envs=2)
    with pytest.raises(ValueError, match="one transition per env"):
        buf.add(np.zeros((3, 3)), np.zeros(3), np.zeros(3), np.zeros((3, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="n_step=0"):
        ReplayBuffer(10, space, gym.spaces.Discrete(2), n_step=0)
    with pytest.raises(ValueError, match="capacity=1 >= num_envs=2"):
        ReplayBuffer(1, space, gym.spaces.Discrete(2), n_step=2, num_envs=2)
    buf.add(*(np.zeros((2, 3)), np.zeros(2), np.zeros(2), np.zeros((2, 3)), np.zeros(2)))
    for capacity, num_envs in ((12, 2), (10, 1)):  # rows are laid out by both
        with pytest.raises(ValueError, match="does not fit"):
            ReplayBuffer(capacity, space, gym.spaces.Discrete(2), n_step=2,
                         num_envs=num_envs).load_state_dict(buf.state_dict())
    with pytest.raises(ValueError, match="gamma=1.5"):
        FrameReplayBuffer(10, gym.spaces.Box(0, 255, (3, 2, 2), np.uint8),
                          gym.spaces.Discrete(2), 1, gamma=1.5)


def _n_step_buffer(layout, capacity=40, n=3, gamma=0.9):
    space = gym.spaces.Box(0, 255, (3, 2, 2), np.uint8)
    if layout == "frames":
        return FrameReplayBuffer(capacity, space, gym.spaces.Discrete(5), 2, n_step=n,
                                 gamma=gamma)
    return ReplayBuffer(capacity, space, gym.spaces.Discrete(5), n_step=n, gamma=gamma,
                        num_envs=2)


def _held_equal(a, b) -> bool:
    held = a.indices()
    return np.array_equal(held, b.indices()) and all(
        torch.equal(x, y) for x, y in zip(a.get(held), b.get(held)))


@pytest.mark.parametrize("layout", ["naive", "frames"])
def test_a_loaded_n_step_replay_ends_each_envs_stream_at_the_resume(layout):
    buf = _n_step_buffer(layout)
    stream = _stream(np.random.default_rng(7), 40, 2, reset_every=(3, 9))
    for _, t in zip(range(25), stream):
        buf.add(*t)
    restored = _n_step_buffer(layout)
    restored.load_state_dict(buf.state_dict())
    assert _held_equal(buf, restored)  # truncations and terminations survive the checkpoint
    # the resumed run starts new episodes: the steps before the resume must not sum them
    newest = restored.indices()[-2:]  # each env's newest step
    before = restored.get(newest - 2)  # two steps earlier: a window of 3 would reach past it
    for _, t in zip(range(3), stream):
        restored.add(*t)
    after = restored.get(newest - 2)
    assert torch.equal(before.rewards, after.rewards)
    assert torch.equal(before.discount, after.discount)
    assert torch.equal(before.next_obs, after.next_obs)


@pytest.mark.parametrize("layout", ["naive", "frames"])
def test_a_replay_saved_before_episode_ends_were_stored_rebuilds_them(layout):
    buf = _n_step_buffer(layout)
    truncations = 0
    for t in _stream(np.random.default_rng(6), 30, 2, reset_every=(2, 5)):
        buf.add(*t)
        truncations += int((t[5] & ~t[4]).sum())
    assert truncations > 3  # ends that terminated alone would not show
    state = buf.state_dict()
    if layout == "frames":
        del state["done"]
    else:  # nor did it record capacity and num_envs
        state["tensors"] = state["tensors"][:5]
        del state["capacity"], state["num_envs"]
    restored = _n_step_buffer(layout)
    restored.load_state_dict(state)
    assert _held_equal(buf, restored)
    if layout == "naive":  # rebuilt a few rows at a time, the same
        whole = restored.done.clone()
        restored._rebuild_done(chunk=7)
        restored._end_streams()
        assert torch.equal(restored.done, whole)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CPU build of "
                    "torch or no driver here)")
@pytest.mark.parametrize("n_step", [1, 3])
def test_a_replay_on_a_gpu_stages_adds_and_equals_the_cpu_replay(n_step, monkeypatch):
    """Adds staged on the host (a stage smaller than the buffer, so it fills, and rows that
    wrap), read back between adds by samples, `get` and `state_dict`: what the CPU buffer,
    written directly, holds."""
    import gmi_drl.rollout.replay as replay_module

    monkeypatch.setattr(replay_module, "STAGE_ROWS", 8)
    obs_space, act_space = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,))
    num_envs = 2
    bufs = [ReplayBuffer(23, obs_space, act_space, device, n_step=n_step, gamma=0.9,
                         num_envs=num_envs) for device in ("cpu", "cuda")]
    g = np.random.default_rng(0)
    for step in range(40):
        data = (g.standard_normal((num_envs, 3)), g.uniform(-1, 1, (num_envs, 2)),
                g.standard_normal(num_envs), g.standard_normal((num_envs, 3)),
                g.random(num_envs) < 0.2, g.random(num_envs) < 0.3)
        for buf in bufs:
            buf.add(*data)
        if step % 5 == 3:
            index = bufs[0].indices()
            cpu, gpu = (buf.get(index) for buf in bufs)
            for a, b in zip(cpu, gpu):
                torch.testing.assert_close(a, b.cpu())
            assert bufs[1]._staged == 0  # the read flushed the stage
    assert bufs[1]._staged > 0  # the last adds are still staged: state_dict must flush
    cpu_state, gpu_state = (buf.state_dict() for buf in bufs)
    for a, b in zip(cpu_state["tensors"], gpu_state["tensors"]):
        torch.testing.assert_close(a, b)
    assert bufs[1].pos == bufs[0].pos and bufs[1].size == bufs[0].size == 23


def test_a_saved_replay_holds_its_rows_only_and_a_damaged_one_is_refused(tmp_path):
    """A checkpoint of a large buffer that holds a few rows is their size, not the capacity's
    (a CPU slice would take its whole storage along); a state whose tensors do not hold the rows
    its ``size`` says is refused as not fitting."""
    space = gym.spaces.Box(-1, 1, (17,), np.float32)
    actions = gym.spaces.Box(-1, 1, (6,), np.float32)
    buf = ReplayBuffer(100_000, space, actions)
    rng = np.random.default_rng(0)
    for _ in range(10):
        buf.add(rng.random((1, 17), np.float32), rng.random((1, 6), np.float32),
                np.ones(1, np.float32), rng.random((1, 17), np.float32), np.zeros(1, bool))
    state = buf.state_dict()
    torch.save(state, tmp_path / "replay.pt")
    assert (tmp_path / "replay.pt").stat().st_size < 50_000  # the capacity: about 17 MB
    other = ReplayBuffer(100_000, space, actions)
    other.load_state_dict(torch.load(tmp_path / "replay.pt"))
    assert other.size == 10
    torch.testing.assert_close(other.state_dict()["tensors"][0], state["tensors"][0])
    with pytest.raises(ValueError, match="does not fit"):
        other.load_state_dict({**state, "size": 50})
