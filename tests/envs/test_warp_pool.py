"""The warp engine (MuJoCo Warp) on Warp's CPU device: the GMI-DRL Table 6 tasks' shapes,
their observation, reward and termination against NumPy references of Isaac Gym's formulas on
recorded states, same-step and masked resets, determinism, MuJoCo C agreement, the contact
limit check, the tensor collection path and a PPO run. The CUDA graph path runs where CUDA is.
"""

import json

import gymnasium as gym
import mujoco
import numpy as np
import pytest
import torch

from gmi_drl import envs
from gmi_drl.envs.spec import AutoresetMode
from gmi_drl.envs.warp.pool import warp_error

pytestmark = pytest.mark.skipif(warp_error() is not None, reason=str(warp_error()))

N = 4

HEAVY = ("Humanoid-gmi-v0", "Anymal-gmi-v0", "FrankaCabinet-gmi-v0", "ShadowHand-gmi-v0")
"""tasks whose first pool on a machine compiles Warp kernels for 20-55 s (their models'): their
tests are marked slow (`make test-all`); Ant and BallBalance cover the engine in `make test`"""


def _tasks_param(*task_ids):
    """``task_ids`` for a parametrize, those of `HEAVY` marked slow."""
    return [pytest.param(t, marks=pytest.mark.slow) if t in HEAVY else t for t in task_ids]


def _tasks():
    from gmi_drl.envs.warp import locomotion

    return locomotion


@pytest.fixture(scope="module", params=_tasks_param("Ant-gmi-v0", "Humanoid-gmi-v0"))
def pool(request):
    with envs.make(request.param, N, seed=11, autoreset="same_step") as p:
        yield p


def _state(pool):
    d = pool._d
    return {k: getattr(d, k).numpy().copy() for k in ("qpos", "qvel", "sensordata",
                                                       "qfrc_actuator")}


def _actions(rng, pool):
    return rng.uniform(-1.3, 1.3, (pool.num_envs, pool.model.nu)).astype(np.float32)  # some clip


@pytest.mark.parametrize("task_id, sizes", [
    pytest.param(t, s, marks=[pytest.mark.slow] if t in HEAVY else []) for t, s in [
        ("Ant-gmi-v0", (60, 8, (256, 128, 64))), ("Humanoid-gmi-v0", (108, 21, (200, 400, 100))),
        ("Anymal-gmi-v0", (48, 12, (256, 128, 64))),
        ("BallBalance-gmi-v0", (24, 3, (256, 128, 64))),
        ("ShadowHand-gmi-v0", (211, 20, (512, 512, 512, 256))),
        ("FrankaCabinet-gmi-v0", (23, 9, (256, 128, 64)))]])
def test_table6_sizes_and_spaces(task_id, sizes):
    with envs.make(task_id, N, seed=0, autoreset="same_step") as p:
        t = p.task
        assert (t.obs_dim, t.action_dim, t.policy) == sizes
        spec = envs.task_spec(t.task_id)
        assert spec.observation_space.shape == (t.obs_dim,) == p.observation_space.shape
        assert spec.action_space.shape == (t.action_dim,) and p.model.nu == t.action_dim
        obs, info = p.reset()
        assert obs.shape == (N, t.obs_dim) and obs.dtype == np.float32
        assert info["env_id"].tolist() == list(range(N))
        _, _, _, _, info = p.step(np.zeros((N, t.action_dim), np.float32))
        assert ("episode_successes" in info) == (task_id == "ShadowHand-gmi-v0")


def test_observation_reward_and_termination_match_the_formulas(pool):
    wt = _tasks()
    rng = np.random.default_rng(0)
    pool.reset()
    prev = _state(pool)
    checked = ended = 0
    for _ in range(40):
        a = _actions(rng, pool)
        obs, rew, term, trunc, info = pool.step(a)
        s = _state(pool)
        done = term | trunc
        for w in range(N):
            if done[w]:  # the state is the reset one: the ending step's obs is final_obs
                ended += 1
                assert info["final_obs"][w, 0] < pool.task.termination_height or trunc[w]
                assert rew[w] == pytest.approx(pool.task.death_cost) or not term[w]
                continue
            ref = wt.reference_observation(pool.task, pool.layout, s["qpos"][w], s["qvel"][w],
                                           s["sensordata"][w], s["qfrc_actuator"][w], a[w])
            np.testing.assert_allclose(obs[w], ref, rtol=1e-4, atol=1e-4)
            progress = _potential(pool, s["qpos"][w]) - _potential(pool, prev["qpos"][w])
            r, fell = wt.reference_reward(pool.task, pool.layout, obs[w].astype(np.float64), a[w],
                                          progress)
            assert rew[w] == pytest.approx(r, rel=1e-4, abs=1e-4) and term[w] == fell
            checked += 1
        prev = s
    assert checked > 100
    assert np.abs(obs[:, -pool.model.nu:]).max() <= 1.0  # actions clipped into the observation
    pool.check_limits()  # the task's nconmax/njmax held


def _potential(pool, qpos):
    from gmi_drl.envs.warp.locomotion import TARGET

    x, y = np.float64(qpos[0]), np.float64(qpos[1])  # as the kernel: ~6e4 differenced
    return -np.hypot(TARGET[0] - x, TARGET[1] - y) / pool.task.control_dt


@pytest.fixture(scope="module")
def anymal():
    with envs.make("Anymal-gmi-v0", N, seed=21, autoreset="same_step") as p:
        yield p


@pytest.mark.slow
def test_anymal_observation_reward_and_termination_match_the_formulas(anymal):
    from gmi_drl.envs.warp import quadruped as q

    p, task = anymal, anymal.task
    obs, _ = p.reset()
    command = p._task_state.numpy().copy()
    for lo_hi, c in zip(task.commands, command.T):  # a fresh command per world, in range
        assert ((lo_hi[0] <= c) & (c <= lo_hi[1])).all() and len(set(c.round(6))) == N
    np.testing.assert_allclose(obs[:, 9:12], command * [2.0, 2.0, 0.25], rtol=1e-6)
    assert not obs[:, 36:].any()  # no action yet
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(30):
        a = rng.uniform(-0.3, 0.3, (N, 12)).astype(np.float32)
        obs, rew, term, trunc, info = p.step(a)
        d = p._d
        qpos, qvel, frc = d.qpos.numpy(), d.qvel.numpy(), d.qfrc_actuator.numpy()
        touch = d.sensordata.numpy()
        for w in np.flatnonzero(~(term | trunc)):
            ref = q.reference_observation(task, p.layout, qpos[w], qvel[w], command[w], a[w])
            np.testing.assert_allclose(obs[w], ref, rtol=1e-4, atol=1e-5)
            r, fell = q.reference_reward(task, p.layout, qpos[w], qvel[w], command[w],
                                         frc[w, p.layout.dof_qvel], touch[w])
            assert rew[w] == pytest.approx(r, rel=1e-4, abs=1e-6) and not fell
            checked += 1
        command = p._task_state.numpy().copy()
    assert checked > 100
    p.check_limits()


@pytest.mark.slow
def test_anymal_stands_on_its_pd_targets_and_terminates_on_its_back(anymal):
    p = anymal
    p.reset()
    for _ in range(100):  # action 0: PD targets at the default pose
        obs, rew, term, trunc, info = p.step(np.zeros((N, 12), np.float32))
        assert not (term | trunc).any()
    z = p._d.qpos.numpy()[:, 2]
    assert (0.5 < z).all() and (z < 0.62).all()  # landed on its feet, standing
    assert (obs[:, 8] < -0.99).all()  # gravity points down the base's z: upright
    qpos = p._d.qpos.numpy()
    qpos[0, 3:7] = [0.0, 1.0, 0.0, 0.0]  # world 0 upside down
    p._d.qpos.assign(qpos)
    ended = False
    for _ in range(60):
        _, _, term, _, info = p.step(np.zeros((N, 12), np.float32))
        if term[0]:
            ended = True
            assert info["final_obs"][0, 8] > 0.9  # it ended on its back
            break
        assert not term[1:].any()
    assert ended


def test_ballbalance_matches_the_formulas_and_integrates_actions():
    from gmi_drl.envs.warp import balance as b

    with envs.make("BallBalance-gmi-v0", N, seed=4, autoreset="same_step") as p:
        task, layout = p.task, p.layout
        obs, _ = p.reset()
        ball = obs[:, 6:9]
        assert (np.hypot(ball[:, 0], ball[:, 1]) <= 0.5).all()
        assert ((1.0 <= ball[:, 2]) & (ball[:, 2] <= 2.0)).all()
        np.testing.assert_allclose(obs[:, 11], -5.0)  # falling at 5 m/s
        assert not obs[:, 12:].any()  # no sensor read yet
        targets = np.zeros((N, 3))
        rng = np.random.default_rng(0)
        checked = 0
        for _ in range(25):
            a = rng.uniform(-1.5, 1.5, (N, 3)).astype(np.float32)
            obs, rew, term, trunc, info = p.step(a)
            targets = np.clip(targets + 0.01 * 20 * np.clip(a, -1, 1), layout.act_lower,
                              layout.act_upper)
            qpos, qvel = p._d.qpos.numpy(), p._d.qvel.numpy()
            sens = p._d.sensordata.numpy()
            for w in np.flatnonzero(~(term | trunc)):
                np.testing.assert_allclose(p._task_state.numpy()[w], targets[w], rtol=1e-5,
                                           atol=1e-6)
                ref = b.reference_observation(task, layout, qpos[w], qvel[w], sens[w])
                np.testing.assert_allclose(obs[w], ref, rtol=1e-4, atol=1e-5)
                r, fell = b.reference_reward(task, qpos[w, layout.ball_qpos:][:3],
                                             qvel[w, layout.ball_qvel:][:3])
                assert rew[w] == pytest.approx(r, rel=1e-5) and not fell
                checked += 1
            targets[term | trunc] = 0.0
        assert checked > 60
        p.check_limits()
        qpos, qvel = p._d.qpos.numpy(), p._d.qvel.numpy()
        qpos[1, layout.ball_qpos:layout.ball_qpos + 3] = [3.0, 0.0, 0.11]  # off the tray, low
        qvel[1, layout.ball_qvel:layout.ball_qvel + 6] = 0.0
        p._d.qpos.assign(qpos)
        p._d.qvel.assign(qvel)
        _, rew, term, _, info = p.step(np.zeros((N, 3), np.float32))
        assert term[1] and info["final_obs"][1, 8] < task.fall_height


@pytest.mark.slow
def test_shadowhand_matches_the_formulas_resamples_goals_and_drops():
    from gmi_drl.envs.warp import hand as h

    with envs.make("ShadowHand-gmi-v0", 2, seed=6, autoreset="same_step") as p:
        task, layout = p.task, p.layout

        def state():
            d = p._d
            return [x.numpy().copy() for x in (d.qpos, d.qvel, d.qfrc_actuator, d.xpos, d.xquat,
                                               d.cvel, d.subtree_com, d.sensordata)]

        obs, _ = p.reset()
        goal = p._task_state.numpy().copy()
        assert np.allclose(np.linalg.norm(goal, axis=1), 1.0, atol=1e-5)  # unit quaternions
        ref = h.reference_observation(task, layout, *[x[0] for x in state()], goal[0],
                                      np.zeros(20))
        # the first observation: fingertips from the reset state's kinematics, no forces yet
        np.testing.assert_allclose(obs[0, :48], ref[:48], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(obs[0, 72:161], ref[72:161], rtol=1e-4, atol=1e-4)
        assert not obs[0, 48:72].any() and not obs[0, 161:].any()
        rng = np.random.default_rng(1)
        for _ in range(4):
            a = rng.uniform(-1, 1, (2, 20)).astype(np.float32)
            obs, rew, term, trunc, info = p.step(a)
            st = state()
            for w in range(2):
                assert not (term | trunc)[w]
                ref = h.reference_observation(task, layout, *[x[w] for x in st], goal[w], a[w])
                np.testing.assert_allclose(obs[w], ref, rtol=1e-4, atol=1e-4)
                r, reached, dropped = h.reference_reward(task, layout, st[0][w], goal[w], a[w])
                assert rew[w] == pytest.approx(r, rel=1e-4) and not reached and not dropped
        p.check_limits()
        # the goal orientation reached: +250, a new goal drawn in the same step
        qpos = p._d.qpos.numpy()
        o = layout.object_qpos
        rot = qpos[1, o + 3:o + 7]
        p._task_state.assign(np.stack([goal[0], [rot[1], rot[2], rot[3], rot[0]]]))
        obs, rew, term, _, info = p.step(np.zeros((2, 20), np.float32))
        new_goal = p._task_state.numpy()
        assert rew[1] > 200 and rew[0] < 200 and not term.any()
        np.testing.assert_array_equal(info["episode_successes"], [0, 1])  # counted per episode
        assert not np.allclose(new_goal[1], [rot[1], rot[2], rot[3], rot[0]], atol=1e-2)
        np.testing.assert_allclose(new_goal[0], goal[0])
        np.testing.assert_allclose(obs[1, 88:92], new_goal[1], rtol=1e-5)  # seen at once
        # the block dropped far from the goal: terminated, its last observation kept
        qpos = p._d.qpos.numpy()
        qpos[0, o:o + 3] = [1.0, 0.87, -0.5]
        p._d.qpos.assign(qpos)
        _, _, term, _, info = p.step(np.zeros((2, 20), np.float32))
        assert term[0] and not term[1] and info["final_obs"][0, 74] < -0.3
        np.testing.assert_array_equal(info["episode_successes"], [0, 1])
        # world 1's episode ends by the time limit with its success; world 0 starts from 0
        p._running_length.assign(np.array([0, task.max_episode_steps - 1], np.int32))
        _, _, term, trunc, info = p.step(np.zeros((2, 20), np.float32))
        assert trunc[1] and not (term | trunc)[0]
        np.testing.assert_array_equal(info["episode_successes"], [0, 1])
        _, _, _, _, info = p.step(np.zeros((2, 20), np.float32))
        np.testing.assert_array_equal(info["episode_successes"], [0, 0])  # both restarted


@pytest.mark.slow
def test_frankacabinet_matches_the_formulas_and_ends_with_the_drawer_open():
    from gmi_drl.envs.warp import franka as f

    with envs.make("FrankaCabinet-gmi-v0", 2, seed=8, autoreset="same_step") as p:
        task, layout = p.task, p.layout
        obs, _ = p.reset()
        d = p._d
        ref = f.reference_observation(task, layout, d.qpos.numpy()[0], d.qvel.numpy()[0],
                                      d.xpos.numpy()[0], d.xquat.numpy()[0])
        np.testing.assert_allclose(obs[0], ref, rtol=1e-4, atol=1e-5)  # the reset state's
        targets = p._task_state.numpy().copy()
        np.testing.assert_allclose(targets, d.qpos.numpy()[:, layout.dof_qpos])
        speed = np.array([1.0] * 7 + [0.1] * 2)
        rng = np.random.default_rng(2)
        for _ in range(4):
            a = rng.uniform(-1.2, 1.2, (2, 9)).astype(np.float32)
            obs, rew, term, trunc, info = p.step(a)
            targets = np.clip(targets + speed * task.control_dt * 7.5 * np.clip(a, -1, 1),
                              layout.dof_lower, layout.dof_upper)
            np.testing.assert_allclose(p._task_state.numpy(), targets, rtol=1e-5, atol=1e-6)
            qpos, qvel = d.qpos.numpy(), d.qvel.numpy()
            xpos, xquat = d.xpos.numpy(), d.xquat.numpy()
            for w in range(2):
                ref = f.reference_observation(task, layout, qpos[w], qvel[w], xpos[w], xquat[w])
                np.testing.assert_allclose(obs[w], ref, rtol=1e-4, atol=1e-4)
                r, opened = f.reference_reward(task, layout, qpos[w], xpos[w], xquat[w], a[w])
                assert rew[w] == pytest.approx(r, rel=1e-4, abs=1e-5) and not opened
        p.check_limits()
        qpos = d.qpos.numpy()
        qpos[1, layout.drawer_qpos] = 0.42  # pulled open past 0.39 m
        d.qpos.assign(qpos)
        _, _, term, _, info = p.step(np.zeros((2, 9), np.float32))
        assert term[1] and not term[0] and info["final_obs"][1, 21] > 0.39


@pytest.mark.slow  # (Humanoid: `HEAVY`)
def test_same_step_autoreset_keeps_final_obs_and_episode_totals():
    with envs.make("Humanoid-gmi-v0", N, seed=3, autoreset="same_step") as p:
        p.reset()
        rng = np.random.default_rng(1)
        totals = np.zeros(N)
        lengths = np.zeros(N, np.int64)
        seen = 0
        for _ in range(80):
            obs, rew, term, trunc, info = p.step(_actions(rng, p))
            totals += rew
            lengths += 1
            np.testing.assert_allclose(info["episode_return"], totals, rtol=1e-5)
            np.testing.assert_array_equal(info["episode_length"], lengths)
            for w in np.flatnonzero(term | trunc):
                seen += 1
                assert info["episode_end"][w]
                assert info["final_obs"][w, 0] < p.task.termination_height  # fell
                root = p.layout.root_qpos
                assert obs[w, 0] == pytest.approx(root[2])  # a fresh episode, at rest
                assert not obs[w, 1:7].any()
                forces = obs[w, 12 + 2 * p.layout.ndof:]
                assert not forces.any()  # no force has acted on a reset state yet
                totals[w], lengths[w] = 0.0, 0
        assert seen >= 4  # random actions topple the humanoid within 80 steps
        p.check_limits()  # fallen humanoids: contacts and joint limits within the task's njmax


def test_masked_reset_resets_only_the_given_worlds():
    with envs.make("Ant-gmi-v0", N, seed=5, autoreset="same_step") as p:
        p.reset()
        rng = np.random.default_rng(2)
        for _ in range(5):
            obs, *_ = p.step(_actions(rng, p))
        before = obs.copy()
        qpos = p._d.qpos.numpy().copy()
        obs2, info = p.reset(env_id=np.array([2]))
        assert info["env_id"].tolist() == [2] and obs2.shape == (1, 60)
        after = p._out["obs"]
        np.testing.assert_array_equal(after[[0, 1, 3]], before[[0, 1, 3]])
        np.testing.assert_array_equal(p._d.qpos.numpy()[[0, 1, 3]], qpos[[0, 1, 3]])
        assert not np.array_equal(after[2], before[2]) and after[2, 0] == pytest.approx(0.75)
        # the next step continues the other worlds' episodes and starts world 2's
        _, _, _, _, info = p.step(_actions(rng, p))
        assert info["episode_length"].tolist() == [6, 6, 1, 6]
        with pytest.raises(ValueError, match="out of range"):
            p.reset(env_id=[N])
        with pytest.raises(ValueError, match="repeats"):
            p.reset(env_id=[1, 1])


def test_determinism_per_seed():
    def run(seed):
        with envs.make("Ant-gmi-v0", N, seed=seed, autoreset="same_step") as p:
            first, _ = p.reset()
            first = first.copy()
            rng = np.random.default_rng(9)
            for _ in range(10):
                obs, *_ = p.step(_actions(rng, p))
            return first, obs.copy()

    a, b, c = run(7), run(7), run(8)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])  # another seed, other reset noise
    assert len({tuple(r) for r in a[0][:, 12:20].round(6)}) == N  # each world its own noise


@pytest.mark.parametrize("task_id", _tasks_param(
    "Ant-gmi-v0", "Humanoid-gmi-v0", "Anymal-gmi-v0", "BallBalance-gmi-v0", "FrankaCabinet-gmi-v0",
    "ShadowHand-gmi-v0"))
def test_warp_physics_agrees_with_mujoco_c(task_id):
    """Same model, same start state and controls (those the pool applied): MuJoCo Warp
    (float32) against MuJoCo C (float64) over 5 env steps. BallBalance's closed chains under
    kp 4000 drives amplify float32 solver residuals in their stiff modes: gentler actions and a
    looser velocity bound there."""
    stiff = task_id == "BallBalance-gmi-v0"
    with envs.make(task_id, 2, seed=1, autoreset="same_step") as p:
        p.reset()
        m = p.model
        data = mujoco.MjData(m)
        data.qpos[:] = p._d.qpos.numpy()[0]
        data.qvel[:] = p._d.qvel.numpy()[0]
        rng = np.random.default_rng(4)
        for _ in range(5):
            a = rng.uniform(-1, 1, (2, m.nu)).astype(np.float32) * (0.3 if stiff else 1.0)
            _, _, term, trunc, _ = p.step(a)
            assert not (term | trunc)[0]
            data.ctrl[:] = p._d.ctrl.numpy()[0]
            for _ in range(p.task.frame_skip):
                mujoco.mj_step(m, data)
        np.testing.assert_allclose(p._d.qpos.numpy()[0], data.qpos, atol=2e-3)
        np.testing.assert_allclose(p._d.qvel.numpy()[0], data.qvel, atol=0.2 if stiff else 5e-2)


def test_contact_overflow_fails_loudly():
    with envs.make("Ant-gmi-v0", 2, seed=0, autoreset="same_step", nconmax=1, njmax=4) as p:
        p.reset()
        rng = np.random.default_rng(0)
        with pytest.raises(RuntimeError, match="overflowed .* nconmax="):
            for _ in range(60):  # the ant lands on its feet: more than one contact
                p.step(_actions(rng, p))
                p.check_limits()


@pytest.mark.slow  # (150 steps of 16 worlds: 5-15 s a task on Warp's CPU device)
@pytest.mark.parametrize("task_id", ["Ant-gmi-v0", "Humanoid-gmi-v0", "Anymal-gmi-v0",
                                     "BallBalance-gmi-v0", "FrankaCabinet-gmi-v0",
                                     "ShadowHand-gmi-v0"])
def test_saturated_actions_neither_diverge_nor_overflow(task_id):
    """Bang-bang actions (PPO's clipped exploration at its extreme) must neither blow the
    integration up nor overflow the task's own constraint rows, or training learns from exploded
    worlds or stops at its first rollout check. Both happened on a GPU: Anymal under explicit
    Euler reached joint velocities of 2e9 and 156 rows of its 128."""
    n = 16
    with envs.make(task_id, n, seed=2, autoreset="same_step") as p:
        p.reset()
        rng = np.random.default_rng(3)
        most, fastest = 0, 0.0
        for _ in range(150):
            p.step(np.sign(rng.uniform(-1, 1, (n, p.model.nu))).astype(np.float32))
            most = max(most, int(p._d.nefc.numpy().max()))
            fastest = max(fastest, float(np.abs(p._d.qvel.numpy()).max()))
        p.check_limits()
        assert fastest < 1e3, f"a joint or body reached {fastest:.3g} (m or rad)/s: diverged"
        assert most <= 0.8 * p.task.njmax, f"{most} of {p.task.njmax} constraint rows"


def test_invalid_pools_and_actions_say_what_is_wrong():
    with pytest.raises(ValueError, match="autoreset='same_step'"):
        envs.make("Ant-gmi-v0", 2, autoreset="next_step")
    with pytest.raises(ValueError, match="engine='numpy' must be one of"):
        envs.make("Ant-gmi-v0", 2, autoreset="same_step", engine="numpy")
    with pytest.raises(ValueError, match="env_batch_size must be num_envs"):
        envs.make("Ant-gmi-v0", 2, env_batch_size=1, autoreset="same_step")
    if not torch.cuda.is_available():  # a GPU device on a machine that has none
        with pytest.raises(ValueError, match="Warp sees no CUDA device here"):
            envs.make("Ant-gmi-v0", 2, autoreset="same_step", device="cuda:0")
    with pytest.raises(ValueError, match="is not a Warp device"):
        envs.make("Ant-gmi-v0", 2, autoreset="same_step", device="tpu")
    with envs.make("Ant-gmi-v0", 2) as p:  # the engine's one mode is the default
        assert p.autoreset is AutoresetMode.SAME_STEP
        with pytest.raises(gym.error.ResetNeeded, match=r"env_id \[0, 1\] never reset"):
            p.step(np.zeros((2, 8), np.float32))
        p.reset([1])
        with pytest.raises(gym.error.ResetNeeded, match=r"env_id \[0\] never reset"):
            p.step(np.zeros((2, 8), np.float32))
        p.reset()
        with pytest.raises(ValueError, match=r"shape \(2, 3\), expected \(2, 8\)"):
            p.step(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="NaN"):
            p.step(np.full((2, 8), np.nan, np.float32))
        with pytest.raises(ValueError, match="every world at once"):
            p.step(np.zeros((1, 8), np.float32), env_id=[0])
        with pytest.raises(RuntimeError, match="send"):
            p.recv()
        p.step(np.zeros((2, 8), np.float32))  # nothing above was sent


def test_tensor_outputs_feed_the_collector_without_numpy():
    """The path a GPU run takes (pool outputs as torch tensors, actions sent as tensors),
    exercised on the CPU."""
    from gmi_drl.models.actor_critic import build_actor_critic
    from gmi_drl.rollout.acting import make_acting
    from gmi_drl.rollout.arrays import DeviceArrays
    from gmi_drl.rollout.collector import Collector
    from gmi_drl.rollout.storage import RolloutBuffer

    with envs.make("Ant-gmi-v0", N, seed=2, autoreset="same_step", tensors=True) as p:
        obs, info = p.reset()
        assert isinstance(obs, torch.Tensor) and isinstance(info["env_id"], torch.Tensor)
        ptr = obs.data_ptr()
        model = build_actor_critic(p.spec.observation_space, p.spec.action_space,
                                   actor_hidden="256:128:64", critic_hidden="256:128:64")
        arrays = DeviceArrays("cpu")
        acting = make_acting(model, torch.Generator().manual_seed(0), arrays, False)
        collector = Collector(p, acting, arrays, None, None)
        assert collector.arrays.pool_tensors
        buf = RolloutBuffer(8, N, p.spec.observation_space, p.spec.action_space, "cpu")
        collector.collect(buf)
        assert torch.isfinite(buf.obs).all() and buf.obs.abs().sum() > 0
        assert buf.rewards.abs().sum() > 0
        obs, *_ = p.step(torch.zeros(N, 8))
        assert obs.data_ptr() == ptr  # the same preallocated buffer, every step
        obs, info = p.reset([1, 3])  # a masked reset answers in tensors too
        assert isinstance(info["env_id"], torch.Tensor) and info["env_id"].tolist() == [1, 3]
        assert isinstance(obs, torch.Tensor) and obs.shape == (2, 60)


def test_device_collection_equals_host_collection():
    """The collector's device path (no host sync per step: episode ends recorded on the device,
    every row bootstrapped then masked) fills the same rollout and episodes as its host path.
    Humanoid with 25-step episodes: both falls (terminated) and time limits (truncated)."""
    import dataclasses

    from gmi_drl.envs.spec import env_seeds
    from gmi_drl.envs.warp.locomotion import HUMANOID
    from gmi_drl.envs.warp.pool import WarpPool
    from gmi_drl.models.actor_critic import build_actor_critic
    from gmi_drl.rollout.acting import make_acting
    from gmi_drl.rollout.arrays import DeviceArrays
    from gmi_drl.rollout.collector import Collector
    from gmi_drl.rollout.storage import RolloutBuffer

    task = dataclasses.replace(HUMANOID, max_episode_steps=25)
    torch.manual_seed(0)
    model = build_actor_critic(envs.task_spec("Humanoid-gmi-v0").observation_space,
                               envs.task_spec("Humanoid-gmi-v0").action_space)
    runs = []
    for tensors in (True, False):
        with WarpPool(task, N, env_seeds(1, N), tensors=tensors) as p:
            arrays = DeviceArrays("cpu")
            acting = make_acting(model, torch.Generator().manual_seed(5), arrays, False)
            collector = Collector(p, acting, arrays, None, None)
            assert collector._on_device == tensors
            buf = RolloutBuffer(96, N, p.spec.observation_space, p.spec.action_space, "cpu")
            episodes = collector.collect(buf)
            runs.append((buf, episodes))
    (a, ea), (b, eb) = runs
    for name in ("obs", "actions", "rewards", "terminated", "truncated"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=0, atol=0)
    # V(final_obs) of every row vs of the truncated rows only: other matmul batch sizes
    torch.testing.assert_close(a.final_values, b.final_values, rtol=1e-5, atol=1e-6)
    assert a.truncated.any() and a.terminated.any() and (a.final_values != 0).any()
    np.testing.assert_array_equal(ea.returns, eb.returns)
    np.testing.assert_array_equal(ea.lengths, eb.lengths)
    assert len(ea.returns) >= N * 2


@pytest.mark.parametrize("tensors", [False, True])
def test_collector_reports_a_tasks_own_episode_totals(tensors):
    """ShadowHand's successes reach `Episodes.extras` on the host and the device path: with
    every orientation within tolerance, each step is a success, so an episode's successes
    equal its length."""
    import dataclasses
    import math

    from gmi_drl.envs.spec import env_seeds
    from gmi_drl.envs.warp.hand import HandTask
    from gmi_drl.envs.warp.pool import WarpPool
    from gmi_drl.models.actor_critic import build_actor_critic
    from gmi_drl.rollout.acting import make_acting
    from gmi_drl.rollout.arrays import DeviceArrays
    from gmi_drl.rollout.collector import Collector
    from gmi_drl.rollout.storage import RolloutBuffer

    task = dataclasses.replace(HandTask(), max_episode_steps=5, success_tolerance=math.pi)
    with WarpPool(task, 2, env_seeds(3, 2), tensors=tensors) as p:
        model = build_actor_critic(p.spec.observation_space, p.spec.action_space)
        arrays = DeviceArrays("cpu")
        acting = make_acting(model, torch.Generator().manual_seed(0), arrays, False)
        buf = RolloutBuffer(12, 2, p.spec.observation_space, p.spec.action_space, "cpu")
        episodes = Collector(p, acting, arrays, None, None).collect(buf)
    assert len(episodes.lengths) >= 4
    np.testing.assert_array_equal(episodes.extras["successes"], episodes.lengths)


def test_ppo_trains_on_the_warp_engine(tmp_path):
    """The ``gmi-ant`` preset, shrunk: observation and reward normalisers over the pool's arrays."""
    from gmi_drl.cli import main

    run = tmp_path / "ant"
    assert main(["train", "ppo", "--preset", "gmi-ant", "--env.num-envs", "4",
                 "--total-timesteps", "256", "--algo.num-steps", "32",
                 "--algo.update-epochs", "1", "--no-compile", "--run-dir", str(run)]) == 0
    summary = (run / "summary.md").read_text()
    assert "PPO on Ant-gmi-v0" in summary and "global_step: 256" in summary
    norm = json.loads((run / "config.json").read_text())["norm"]
    assert norm["obs"] and norm["reward"]


def test_two_gmis_reduce_gradients_over_warp_pools(tmp_path):
    """Multi-GMI over the warp engine: two processes, each its own pool, MPR between them."""
    from gmi_drl.cli import main

    run = tmp_path / "anymal2"
    assert main(["train", "ppo", "--env.task-id", "Anymal-gmi-v0", "--env.num-envs", "4",
                 "--total-timesteps", "512", "--algo.num-steps", "32", "--gmi.num-gmis", "2",
                 "--gmi.reduction", "mpr", "--algo.update-epochs", "1",
                 "--algo.num-minibatches", "1", "--no-compile", "--run-dir", str(run)]) == 0
    summary = (run / "summary.md").read_text()
    assert "one process per GMI (2)" in summary and "`mpr`" in summary
    assert "global_step: 512" in summary


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_cuda_graph_step_returns_device_tensors_in_place():
    with envs.make("Ant-gmi-v0", 512, seed=0, autoreset="same_step", device="cuda:0") as p:
        obs, _ = p.reset()
        assert obs.is_cuda and p.tensors
        ptr = obs.data_ptr()
        a = torch.zeros(512, 8, device="cuda:0")
        for _ in range(3):  # uncaptured, captured, replayed
            obs, rew, term, trunc, info = p.step(a)
        assert p._graph is not None and obs.data_ptr() == ptr and rew.is_cuda
        assert torch.isfinite(obs).all()
        p.check_limits()


def test_bad_pool_arguments_and_actions_are_refused_clearly():
    """NaN in a torch action (as in a NumPy one), keywords the engine does not take, seeds it
    would alias, empty contact buffers, use after close; a torch.device names a Warp device."""
    def make(**kw):
        kw = {"seed": 0, **kw}
        return envs.make("Ant-gmi-v0", 2, autoreset="same_step", device=kw.pop("device", "cpu"),
                         **kw)

    with make(device=torch.device("cpu")) as pool:
        pool.reset()
        with pytest.raises(ValueError, match="NaN"):
            pool.step(torch.full((2, pool.model.nu), float("nan")))
    with pytest.raises(RuntimeError, match="closed"):  # as step after close does
        pool.check_limits()
    with pytest.raises(ValueError, match=r"does not take the keyword\(s\) \['foo'\]"):
        make(foo=1)
    with pytest.raises(ValueError, match="episodes are 1000 steps"):
        make(max_episode_steps=10)
    make(max_episode_steps=None).close()
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\*\*63\)"):  # every engine's
        make(seed=-1)
    with pytest.raises(ValueError, match=r"seeds in \[0, 2\*\*31\)"):  # warp's own
        make(seed=2**31 - 1)
    with pytest.raises(ValueError, match="nconmax=0 must be >= 1"):
        make(nconmax=0)
    with pytest.raises(ValueError, match="'gpu' is not a Warp device"):
        make(device="gpu")
