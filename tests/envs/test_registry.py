"""The registry's one registration shape and one engine selector (`gmi_drl.envs.registry`)."""

from __future__ import annotations

import numpy as np
import pytest

from gmi_drl import envs
from gmi_drl.config import ConfigError, EnvConfig, TrainConfig, validate
from gmi_drl.envs import cartpole_native
from gmi_drl.envs.classic_control import make_batch
from gmi_drl.envs.factories import EngineEntry, stepped

CARTPOLE = stepped(lambda num_envs, num_threads: make_batch("CartPole-v1", num_envs), 500)


def _missing(reason):
    return EngineEntry(lambda request, **kw: pytest.fail("an unavailable engine was built"),
                       unavailable=lambda kwargs: reason)


def test_engines_are_listed_in_the_order_auto_tries_them():
    assert envs.engines("Pong-v5") == ["native", "ale"]
    assert envs.engines("Ant-gmi-v0") == ["warp"]
    # every Gymnasium id also has Gymnasium's own env as an engine, last
    assert envs.engines("CartPole-v1") == ["native", "numpy", "gymnasium"]
    assert envs.engines("Hopper-v5") == ["native", "numpy", "gymnasium"]
    assert envs.engines("Pendulum-v1") == ["numpy", "gymnasium"]
    assert envs.engines("Taxi-v4") == ["gymnasium"]
    with pytest.raises(ValueError, match="unknown task_id='Nope-v0'"):
        envs.engines("Nope-v0")


def test_auto_skips_an_engine_that_cannot_run_here_and_explicit_choice_names_why():
    envs.register("Fallback-test", engines={"native": _missing("core not built here"),
                                            "numpy": CARTPOLE})
    with envs.make("Fallback-test", 3, seed=1) as pool:
        obs, _ = pool.reset()
        assert obs.shape == (3, 4) and pool.spec.max_episode_steps == 500
    with pytest.raises(ValueError, match="engine='native' cannot run Fallback-test: core not"):
        envs.make("Fallback-test", 3, engine="native")
    with pytest.raises(ValueError, match=r"must be one of \['auto', 'native', 'numpy'\]"):
        envs.make("Fallback-test", 3, engine="warp")

    envs.register("Nowhere-test", engines={"native": _missing("no compiler"),
                                           "warp": _missing("no GPU stack")})
    with pytest.raises(ValueError, match=r"no engine of Nowhere-test can run here "
                                         r"\(native: no compiler; warp: no GPU stack\)"):
        envs.make("Nowhere-test", 2)


def test_an_engine_unavailable_for_some_options_gives_way_to_the_next(caplog):
    # ale-py's groups are an option of the ale engine only: auto moves on to it
    with envs.make("Pong-v5", 2, group_size=2) as pool:
        assert type(pool._engine).__name__ == "AtariEngine"
    # an engine passed over for a keyword is named (CartPole's C++ core has its 500-step limit)
    if cartpole_native.UNAVAILABLE is None:
        with caplog.at_level("INFO", logger="gmi_drl.envs.registry"):
            with envs.make("CartPole-v1", 2, max_episode_steps=100) as pool:
                assert pool.spec.max_episode_steps == 100
        assert "CartPole-v1 on the numpy engine: native cannot take these keywords (its core " \
            "has CartPole-v1's 500-step limit built in" in caplog.text
        caplog.clear()
        with caplog.at_level("INFO", logger="gmi_drl.envs.registry"):
            envs.make("CartPole-v1", 2).close()  # (nothing passed over: nothing said)
        assert "engine" not in caplog.text


def test_new_engine_names_are_tried_after_the_known_ones():
    envs.register("Custom-test", engines={"mine": CARTPOLE, "numpy": _missing("off")})
    assert envs.engines("Custom-test") == ["numpy", "mine"]
    with envs.make("Custom-test", 2) as pool:
        assert pool.observation_space.shape == (4,)


@pytest.mark.skipif(cartpole_native.UNAVAILABLE is not None, reason="C++ CartPole pool not built")
@pytest.mark.parametrize("engine", ["numpy", "gymnasium"])
def test_every_cartpole_engine_follows_the_same_seeds(engine):
    """One seeding rule: the C++ pool, the NumPy task and Gymnasium's own env (in worker
    processes) give the same trajectories for the same seeds and actions."""
    actions = np.random.default_rng(0).integers(0, 2, (120, 4))
    out = {}
    for name in ("native", engine):
        with envs.make("CartPole-v1", 4, seed=11, engine=name, num_workers=2) as pool:
            obs, _ = pool.reset()
            seen = [obs.copy()]
            for a in actions:
                obs, *_ = pool.step(a)
                seen.append(obs.copy())
        out[name] = np.array(seen)
    np.testing.assert_array_equal(out["native"], out[engine])


def test_register_takes_one_shape():
    with pytest.raises(ValueError, match="exactly one"):
        envs.register("Both-test", "CartPole-v1", engines={"numpy": CARTPOLE})
    with pytest.raises(ValueError, match="exactly one"):
        envs.register("Empty-test", engines={})


def test_task_spec_reads_the_chosen_engine():
    spec = envs.task_spec("Ant-gmi-v0")  # from the task definition: no model is built
    assert spec.observation_space.shape == (60,) and spec.action_space.shape == (8,)
    assert envs.task_spec("CartPole-v1", engine="gymnasium").max_episode_steps is None
    assert envs.task_spec("CartPole-v1", engine="numpy").max_episode_steps == 500


def test_config_refuses_an_engine_the_task_does_not_have():
    cfg = TrainConfig(env=EnvConfig(task_id="Pendulum-v1", num_envs=2, engine="native"))
    with pytest.raises(ConfigError, match=r"env.engine='native' must be one of "
                                          r"\['auto', 'numpy', 'gymnasium'\] for Pendulum-v1"):
        validate(cfg)


def test_a_launchers_cpu_budget_sizes_the_default_env_workers(monkeypatch):
    """A Ray GMI's affinity is its whole node: the CPUs it reserved (GMI_NUM_CPUS) bound the
    default num_workers instead."""
    import os

    from gmi_drl.envs.registry import cpu_budget

    monkeypatch.delenv("GMI_NUM_CPUS", raising=False)
    assert cpu_budget() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("GMI_NUM_CPUS", "1")
    assert cpu_budget() == 1
    with envs.make("Reacher-v5", num_envs=4) as pool:  # a worker process per CPU of the budget
        assert pool._engine.num_workers == 1
    monkeypatch.setenv("GMI_NUM_CPUS", "zero")  # not a count: ignored
    assert cpu_budget() == len(os.sched_getaffinity(0))


def test_register_refuses_what_make_could_not_build():
    with pytest.raises(ValueError, match=r"env_fn=42 must be a Gymnasium id or a callable"):
        envs.register("Bad-fn-test", 42)
    with pytest.raises(ValueError, match=r"engines \['numpy'\] must be "
                                         r"gmi_drl.envs.factories.EngineEntry values"):
        envs.register("Bad-engine-test", engines={"numpy": lambda request: None})
    assert "Bad-fn-test" not in envs.list_tasks() and "Bad-engine-test" not in envs.list_tasks()


def test_a_task_registered_in_the_driver_trains_in_gmi_processes(tmp_path):
    """The GMIs of a local run are forked from a fork server that never ran the caller's
    register(): the run carries the registration (a closure here, pickled by value)."""
    import gymnasium as gym

    from gmi_drl.train import train
    from tests.algos.test_placements import small_cfg

    limit = 5  # shorter than any CartPole episode of random play
    envs.register("Closure-CartPole-test", lambda **kw: gym.make("CartPole-v1",
                                                                 max_episode_steps=limit))
    cfg = small_cfg(tmp_path, "ppo", 2, "registered")
    cfg.env.task_id = "Closure-CartPole-test"
    result = train(cfg)
    assert result.global_step == 6 * cfg.batch_size and len(set(result.weight_digests)) == 1
    returns = np.asarray(result.episode_returns)  # 1 per step: the closure's own time limit
    assert len(returns) and returns.max() == limit
