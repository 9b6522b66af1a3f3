import numpy as np
import torch

from gmi_drl.rollout.normalize import ObsNormalizer, RewardNormalizer, RunningMeanStd


def test_running_mean_std_matches_numpy_over_batches():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 7, 30, 2)]
    rms = RunningMeanStd((4,), epsilon=1e-12)
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-9)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-9)
    assert rms.count == len(data) + 1e-12


def _pooled(eps: float, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``data`` pooled with the prior (mean 0, var 1, weight ``eps``),
    computed directly: what the running statistics must hold after seeing ``data``."""
    total = eps + len(data)
    mean = data.sum(0) / total
    return mean, (eps * 1.0 + (data ** 2).sum(0)) / total - mean ** 2


def test_obs_normalizer_scales_clips_and_round_trips():
    norm = ObsNormalizer((2,), clip=1.5)
    seen = np.random.default_rng(1).normal(2.0, 3.0, size=(20, 8, 2))
    for batch in seen:
        norm(batch)
    mean, var = _pooled(1e-4, seen.reshape(-1, 2))
    obs = np.array([[2.5, -0.5], [100.0, -100.0]])
    expected = np.clip((obs - mean) / np.sqrt(var + 1e-8), -1.5, 1.5)
    out = norm(obs, update=False)
    np.testing.assert_allclose(out, expected, rtol=1e-9)
    assert abs(out[0, 0]) < 1.5 and abs(out[0, 1]) < 1.5  # the first row is scaled, not clipped
    np.testing.assert_array_equal(out[1], [1.5, -1.5])
    other = ObsNormalizer((2,))
    other.load_state_dict(norm.state_dict())
    np.testing.assert_array_equal(other.rms.mean, norm.rms.mean)
    assert isinstance(norm.state_dict()["mean"], torch.Tensor)


def test_reward_normalizer_tracks_discounted_return_and_resets_on_done():
    """The statistics are those of the discounted returns (1, 2), then (1.5, 1): env 1's
    return is folded in before its episode's end zeroes it; rewards are divided by their std,
    not centred, and clipped."""
    norm = RewardNormalizer(num_envs=2, gamma=0.5, clip=1.2)
    norm(np.array([1.0, 2.0]), np.array([False, True]))
    np.testing.assert_array_equal(norm.returns, [1.0, 0.0])  # env 1's episode ended
    out = norm(np.array([1.0, -3.0]), np.array([False, False]))
    np.testing.assert_array_equal(norm.returns, [1.5, -3.0])
    _, var = _pooled(1e-4, np.array([1.0, 2.0, 1.5, -3.0]))
    np.testing.assert_allclose(norm.rms.var, var, rtol=1e-9)
    scaled = 1.0 / np.sqrt(var + 1e-8)
    assert scaled < 1.2  # unclipped; -3 / std is below -1.2: clipped
    np.testing.assert_allclose(out, [scaled, -1.2], rtol=1e-9)


def test_reward_normalizer_rows_update_only_their_envs():
    """The serving role's env splits normalise one split at a time: ``rows`` touches only those
    envs' returns, and a state_dict taken before is not changed afterwards."""
    norm = RewardNormalizer(num_envs=4, gamma=0.5)
    norm(np.array([1.0, 1.0, 1.0, 1.0]), np.zeros(4, bool))
    saved = norm.state_dict()["returns"].clone()
    before = norm.state_dict()["returns"]
    out = norm(np.array([2.0, 4.0]), np.array([False, True]), slice(2, 4))
    np.testing.assert_array_equal(norm.returns, [1.0, 1.0, 2.5, 0.0])
    assert np.isclose(norm.rms.count - RunningMeanStd(()).count, 6)  # 4 returns, then 2
    np.testing.assert_allclose(out, np.array([2.0, 4.0]) / np.sqrt(norm.rms.var + 1e-8))
    np.testing.assert_array_equal(before.numpy(), saved.numpy())


def test_device_arrays_normalise_like_host_arrays():
    """The torch path (what runs on a GPU; here torch on the CPU) equals the NumPy path."""
    from gmi_drl.rollout.arrays import DeviceArrays

    rng = np.random.default_rng(2)
    host_obs, dev_obs = ObsNormalizer((3,)), ObsNormalizer((3,), arrays=DeviceArrays("cpu"))
    host_rew = RewardNormalizer(4, 0.99)
    dev_rew = RewardNormalizer(4, 0.99, arrays=DeviceArrays("cpu"))
    for _ in range(30):
        obs, rew = rng.normal(2.0, 3.0, size=(4, 3)), rng.normal(size=4).astype(np.float32)
        done = rng.random(4) < 0.2
        np.testing.assert_allclose(dev_obs(torch.from_numpy(obs)).numpy(), host_obs(obs),
                                   rtol=1e-12)
        np.testing.assert_allclose(dev_rew(torch.from_numpy(rew), torch.from_numpy(done)).numpy(),
                                   host_rew(rew, done), rtol=1e-6)
    state = dev_obs.state_dict()
    restored = ObsNormalizer((3,))
    restored.load_state_dict(state)
    np.testing.assert_allclose(restored.rms.var, dev_obs.rms.var.numpy(), rtol=0)
