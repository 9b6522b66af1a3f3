"""What the Gymnasium and Stable-Baselines3 faces of a pool share (`gym_vector`, `sb3`): the
checks of their arguments, their seeds, and NumPy copies of a device pool's outputs.

A face is a NumPy API, as the libraries it stands in for: over a pool that returns torch
tensors (the warp engine on a CUDA device) it copies each output to the host once per call.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import numpy as np

from gmi_drl.envs.spec import env_seeds, random_seed


OWNED_BY_EVERY_FACE = {"env_batch_size": "a vector env returns every env at each step; "
                                         "gmi_drl.envs.make(..., env_batch_size=) gives partial "
                                         "batches"}
"""`make` keywords both faces set themselves (`check_face_args`'s ``owned``), and what to use
instead"""


def check_face_args(face: str, num_envs: Any, task_kwargs: dict[str, Any],
                    owned: dict[str, str]) -> None:
    """Refuse what a face sets itself, before any pool is built.

    Args:
        face: the face's name, for the message.
        num_envs: as given by the caller.
        task_kwargs: the keywords that would go on to `gmi_drl.envs.make`.
        owned: ``{keyword: what to use instead}``: `make` keywords the face sets itself.

    Raises:
        ValueError: ``num_envs`` is no int >= 1, or ``task_kwargs`` holds a keyword of
            ``owned`` (every problem named at once).
    """
    errors = []
    if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)) \
            or num_envs < 1:
        errors.append(f"num_envs={num_envs!r} must be an int >= 1")
    errors += [f"{key}= is set by the face: {instead}" for key, instead in owned.items()
               if key in task_kwargs]
    if errors:
        raise ValueError(f"invalid {face}: " + "; ".join(errors))


def face_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> np.ndarray:
    """``(num_envs,) int64`` first-reset seeds of a face's pool: ``seed + i`` for an int, the
    items of a list, and for ``None`` items seeds drawn from the list's ints (reproducible: the
    same list gives the same seeds); ``None``, or a list of ``None`` only, gives random seeds.

    Raises:
        ValueError: a list of another length, or an item that is no int (`env_seeds`).
    """
    if seed is None or (isinstance(seed, (list, tuple)) and seed
                        and all(s is None for s in seed)):
        return env_seeds(random_seed(num_envs), num_envs)
    if isinstance(seed, (list, tuple)) and any(s is None for s in seed):
        given = [s for s in seed if s is not None]
        if len(seed) != num_envs:
            raise ValueError(f"seed has {len(seed)} items, expected one per env ({num_envs})")
        drawn = iter(np.random.SeedSequence([int(s) for s in given])
                     .generate_state(num_envs - len(given), np.uint64) % (2**31 - 1))
        seed = [int(next(drawn)) if s is None else s for s in seed]
    return env_seeds(seed, num_envs)


def host_outputs(pool) -> Callable[[Any], Any]:
    """The identity for a pool that returns NumPy; for one that returns torch tensors, a
    function that copies a result (an array, or a tuple / dict of them) to NumPy host arrays."""
    if not getattr(pool, "tensors", False):
        return lambda out: out

    def to_host(out: Any) -> Any:
        if isinstance(out, tuple):
            return tuple(to_host(x) for x in out)
        if isinstance(out, dict):
            return {k: to_host(v) for k, v in out.items()}
        return out.detach().cpu().numpy() if hasattr(out, "detach") else out

    return to_host


def rebuild(make: Callable[[np.ndarray], Any], old_pool, seeds: np.ndarray):
    """A new pool from ``make(seeds)``, then ``old_pool`` closed: a seed the engine refuses
    raises here and leaves the face on its old pool, still usable."""
    pool = make(seeds)
    old_pool.close()
    return pool


def shared_env_attr(face, name: str, space_attrs: tuple[str, str]) -> Any:
    """What every env of ``face``'s pool shares, as a face's ``get_attr`` / ``call`` returns it
    per env: ``render_mode`` (``None``: pools do not render), one env's observation and action
    spaces (the face's attributes ``space_attrs``), the face's ``metadata``, and ``spec`` (the
    Gymnasium registration of the task id, or ``None`` for a gmi-drl-only task). Read when
    asked (SB3's ``VecEnv.__init__`` asks for ``render_mode`` before ``metadata`` exists).

    Raises:
        AttributeError: any other name (the envs of a pool are no Python objects with
            attributes or methods of their own).
    """
    import gymnasium as gym

    shared = {"render_mode": lambda: None,
              "observation_space": lambda: getattr(face, space_attrs[0]),
              "action_space": lambda: getattr(face, space_attrs[1]),
              "metadata": lambda: face.metadata,
              "spec": lambda: copy.deepcopy(gym.registry.get(face.pool.spec.task_id))}
    if name not in shared:
        raise AttributeError(
            f"gmi-drl pools have no per-env attribute or method {name!r}: the envs of a pool are "
            "no Python objects (only render_mode, observation_space, action_space, metadata "
            "and spec are shared by all of them)")
    return shared[name]()
