"""gmi-drl's environment engine: EnvPool's batched `send`/`recv` API over native and generic envs.

    pool = gmi_drl.envs.make("Hopper-v5", num_envs=16, env_batch_size=8, seed=0)
    obs, info = pool.reset()
    pool.send(actions, info["env_id"]); obs, rew, term, trunc, info = pool.recv()
"""

from gmi_drl.envs.pool import EnvPool
from gmi_drl.envs.registry import list_tasks, make, register
from gmi_drl.envs.spec import AutoresetMode, EnvSpec

__all__ = ["AutoresetMode", "EnvPool", "EnvSpec", "list_tasks", "make", "register"]
