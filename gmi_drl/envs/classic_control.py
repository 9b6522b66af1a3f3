"""Native classic control tasks: Gymnasium's five, vectorised in NumPy over a pool's envs.

Sources (Gymnasium 1.x, ``gymnasium/envs/classic_control/``): ``cartpole.py`` (CartPole-v1),
``pendulum.py`` (Pendulum-v1), ``acrobot.py`` (Acrobot-v1), ``mountain_car.py`` (MountainCar-v0)
and ``continuous_mountain_car.py`` (MountainCarContinuous-v0).

Each task is a `BatchedEnv` holding the state of all ``num_envs`` envs in one float64 array of
shape ``(state_dim, num_envs)`` (a row per state variable, so each variable of a batch is a
contiguous vector). A step is a fixed sequence of NumPy calls over the stepped envs, never a
per-env Python loop; when the ids are all envs in order (a synchronous pool) it works on the state
array in place, otherwise it gathers the rows of ``ids`` once and scatters them back once. A reset
is a short per-env loop (one generator call per env) so that each env draws from its own
``np.random.Generator`` exactly as the Gymnasium env does.

Fidelity. Every expression is evaluated in Gymnasium's operation order and dtypes, so the
results equal the Gymnasium envs' bit for bit (checked by ``tests/envs/test_classic_control.py``)
with one exception: Pendulum squares its float32 torque as ``u**2``, which for a NumPy float32
scalar is C ``powf`` (not always correctly rounded); NumPy has no vectorised ``powf`` (its
``power`` reduces ``x**2`` to ``x*x``), so for the rare ``u`` where the two differ (about 1 in
1000) the torque cost ``0.001 * u**2`` differs by ``0.001`` float32 ulp of ``u**2`` plus one
float32 rounding: below ``1e-9`` in the reward (``|u| <= 2``); the dynamics are unaffected.
Float64 ``x**2`` of NumPy scalars is C ``pow``, reproduced exactly by `numpy.float_power`.

Box actions are taken as float32 (the action space's dtype): other float dtypes are rounded to it
first. ``truncated`` is always False: the pool applies the time limits registered here.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Sequence

import gymnasium as gym
import numpy as np

from gmi_drl.envs.batched import BatchedEnv, StepResult
from gmi_drl.envs.factories import EngineEntry, stepped
from gmi_drl.envs.spec import EnvGenerators

_F32, _F64 = np.float32, np.float64


def _c(value: float) -> np.ndarray:
    """A float64 constant as a 0-d array: NumPy combines it with an array faster than a Python
    float (no scalar conversion per op), with the identical IEEE result (only for float64
    operands)."""
    return np.array(value, _F64)


class ClassicControlBatch(BatchedEnv):
    """Common machinery: per-env generators, state array, output buffers, gather/scatter.

    Subclasses set `state_dim`, the spaces, and implement `_draw` (one env's reset draws),
    `_observe` (state to observation) and `_advance` (one step of a batch, in place).

    Args:
        num_envs: sub-environments, ``>= 1``.
        num_threads: accepted for the factory signature; the step is one NumPy call sequence in
            the calling thread (these tasks cost far less than a thread hand-off).
    """

    state_dim: int
    _ROWS: list[int] | None = None  # state row of each entry of Gymnasium's state (None: same)

    def __init__(self, num_envs: int, num_threads: int = 1) -> None:
        del num_threads
        n = int(num_envs)
        if n < 1:
            raise ValueError(f"num_envs={num_envs!r} must be >= 1")
        self.num_envs = n
        self._state = np.zeros((self.state_dim, n), _F64)
        self._rngs = EnvGenerators(n)
        self._all_ids = np.arange(n, dtype=np.int64).tobytes()
        self._obs = np.zeros((n, *self.observation_space.shape), self.observation_space.dtype)
        self._reward = np.zeros(n, _F64)
        self._terminated = np.zeros(n, bool)
        self._truncated = np.zeros(n, bool)

    # --- BatchedEnv -----------------------------------------------------------------------------
    def reset(self, ids: np.ndarray, seeds: Sequence[int | None]) -> np.ndarray:
        """Draw the initial state of each env of ``ids`` as the Gymnasium env's ``reset`` does.

        Args:
            ids: ``(n,) int64`` env indices.
            seeds: per id, an int re-creates that env's generator with
                ``gymnasium.utils.seeding.np_random(seed)``; ``None`` continues it (an env never
                seeded gets a randomly seeded one, as in Gymnasium).

        Returns:
            ``(n, *obs_shape) float32`` first observations (an internal buffer).

        Raises:
            gymnasium.error.Error: a seed is negative.
        """
        rngs, ids_list = self._rngs, ids.tolist()
        n = len(ids_list)
        draws = []
        for i, seed in zip(ids_list, seeds):
            draws.append(self._draw(rngs(i, seed)))
        states = np.array(draws, _F64).T  # (state_dim, n), Gymnasium's order
        internal = states if self._ROWS is None else states[self._ROWS]
        if n == 1:
            self._state[:, ids_list[0]] = internal[:, 0]
        else:
            self._state[:, ids] = internal
        obs = self._obs[:n]
        self._reset_observe(ids, states, obs)
        return obs

    def step(self, ids: np.ndarray, actions: np.ndarray) -> StepResult:
        """Advance each env of ``ids`` by one step (see the module docstring for fidelity).

        Args:
            ids: ``(n,) int64`` distinct env indices.
            actions: ``(n,)`` integers (Discrete tasks) or ``(n, 1)`` floats (Box tasks), valid.

        Returns:
            ``(obs (n, *obs_shape) float32, reward (n,) float64, terminated (n,) bool,
            truncated (n,) bool)``, internal buffers valid until the next call.
        """
        n = len(ids)
        if n == self.num_envs and ids.tobytes() == self._all_ids:  # all envs, in order
            self._advance(self._state, ids, actions, self._obs, self._reward, self._terminated)
            return self._obs, self._reward, self._terminated, self._truncated
        state = self._state.take(ids, axis=1)
        obs, reward, terminated = self._obs[:n], self._reward[:n], self._terminated[:n]
        self._advance(state, ids, actions, obs, reward, terminated)
        self._state[:, ids] = state
        return obs, reward, terminated, self._truncated[:n]

    def get_state(self, ids: np.ndarray) -> np.ndarray:
        """The states of ``ids (n,)`` as ``(n, state_dim) float64``, a copy, ordered as the
        ``state`` attribute of the unwrapped Gymnasium env (for tests and inspection)."""
        state = self._state[:, ids] if self._ROWS is None else self._state[self._ROWS][:, ids]
        return np.ascontiguousarray(state.T)

    # --- per task -------------------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """One env's reset: the Gymnasium env's draws from ``rng``, as its ``(state_dim,)``
        state (Gymnasium's order)."""
        raise NotImplementedError

    def _observe(self, state: np.ndarray, obs: np.ndarray) -> None:
        """Write observations ``(n, obs_dim)`` of ``state (state_dim, n)`` into ``obs``."""
        obs.T[...] = state

    def _reset_observe(self, ids: np.ndarray, state: np.ndarray, obs: np.ndarray) -> None:
        """Observations of freshly reset envs from their ``state`` in Gymnasium's order."""
        self._observe(state, obs)

    def _advance(self, state: np.ndarray, ids: np.ndarray, actions: np.ndarray,
                 obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray) -> None:
        """Step ``state (state_dim, n)`` in place and fill ``obs``, ``reward``, ``terminated``."""
        raise NotImplementedError


# --- CartPole-v1 ---------------------------------------------------------------------------------
class CartPole(ClassicControlBatch):
    """CartPole-v1 (``cartpole.py``, Barto, Sutton & Anderson 1983), Euler integration.

    Observation ``[x (m), x_dot (m/s), theta (rad), theta_dot (rad/s)]``; actions
    ``{0: push left, 1: push right}`` with 10 N; reward 1 per step (``sutton_barto_reward``: 0,
    and -1 on the terminating step); terminates when ``|x| > 2.4`` or ``|theta| > 12 deg``.
    Reset: each variable uniform in ``[-0.05, 0.05)``. The state rows are kept in the order
    ``[x, theta, x_dot, theta_dot]`` so that positions and velocities are contiguous blocks.

    Args:
        sutton_barto_reward: as the Gymnasium constructor argument.
    """

    state_dim = 4
    _ROWS = [0, 2, 1, 3]  # state row of each Gymnasium state entry (a self-inverse permutation)

    def __init__(self, num_envs: int, num_threads: int = 1, *,
                 sutton_barto_reward: bool = False) -> None:
        self.action_space = gym.spaces.Discrete(2)
        gravity, masscart, masspole, length = 9.8, 1.0, 0.1, 0.5
        total_mass = masspole + masscart
        polemass_length = masspole * length
        self.x_threshold = 2.4
        self.theta_threshold_radians = 12 * 2 * math.pi / 360
        high = np.array([self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf],
                        dtype=_F32)
        self.observation_space = gym.spaces.Box(-high, high, dtype=_F32)
        super().__init__(num_envs, num_threads)
        self._force = np.array([-10.0, 10.0])  # force_mag by action
        self._gravity, self._masspole, self._length = _c(gravity), _c(masspole), _c(length)
        self._total_mass, self._polemass_length = _c(total_mass), _c(polemass_length)
        self._four_thirds, self._tau = _c(4.0 / 3.0), _c(0.02)
        self._views: dict[int, tuple] = {}
        if sutton_barto_reward:
            self._reward_table = np.array([0.0, -1.0])  # by terminated
        else:
            self._reward_table = None
            self._reward[:] = 1.0

    def _buffers(self, n: int) -> tuple:
        """Scratch buffers for a batch of ``n`` and the ``(2, 2, n)`` view of ``obs[:n]`` that
        takes the state rows ``[[x, theta], [x_dot, theta_dot]]``."""
        views = self._views.get(n)
        if views is None:
            limits = np.empty((2, n))  # |x| > 2.4 or |theta| > thr: the source's 4 comparisons
            limits[0], limits[1] = self.x_threshold, self.theta_threshold_radians
            obs_view = self._obs[:n].T.reshape(2, 2, n).transpose(1, 0, 2)
            views = self._views[n] = (np.empty((4, n)), np.empty((2, n)), np.empty((2, n), bool),
                                      limits, obs_view)
        return views

    def _draw(self, rng):
        return rng.uniform(low=-0.05, high=0.05, size=(4,))

    def _reset_observe(self, ids, state, obs):
        obs.T[...] = state  # Gymnasium's order is the observation's

    def _advance(self, state, ids, actions, obs, reward, terminated):
        n = state.shape[1]
        deriv, magnitude, out_of_bounds, limits, obs_view = self._buffers(n)
        theta, theta_dot = state[1], state[3]
        force = self._force[actions]
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        # temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
        temp = np.square(theta_dot)
        temp *= self._polemass_length
        temp *= sintheta
        temp += force
        temp /= self._total_mass
        # thetaacc = (gravity * sintheta - costheta * temp)
        #            / (length * (4/3 - masspole * costheta**2 / total_mass))
        den = np.square(costheta)
        den *= self._masspole
        den /= self._total_mass
        np.subtract(self._four_thirds, den, out=den)
        den *= self._length
        thetaacc = np.multiply(self._gravity, sintheta, out=deriv[3])
        thetaacc -= costheta * temp
        thetaacc /= den
        # xacc = temp - polemass_length * thetaacc * costheta / total_mass
        xacc = np.multiply(self._polemass_length, thetaacc, out=deriv[2])
        xacc *= costheta
        xacc /= self._total_mass
        np.subtract(temp, xacc, out=xacc)
        # Euler: [x, theta, x_dot, theta_dot] += tau * [x_dot, theta_dot, xacc, thetaacc]
        deriv[:2] = state[2:]
        deriv *= self._tau
        state += deriv
        np.abs(state[:2], out=magnitude)
        np.greater(magnitude, limits, out=out_of_bounds)
        np.logical_or(out_of_bounds[0], out_of_bounds[1], out=terminated)
        obs_view[...] = state.reshape(2, 2, n)
        if self._reward_table is not None:
            reward[...] = self._reward_table[terminated.view(np.uint8)]


# --- Pendulum-v1 ---------------------------------------------------------------------------------
class Pendulum(ClassicControlBatch):
    """Pendulum-v1 (``pendulum.py``): swing a pendulum up with a bounded torque.

    State ``[theta (rad), theta_dot (rad/s)]``; observation ``[cos theta, sin theta, theta_dot]``;
    action ``(1,)`` torque in ``[-2, 2]`` N m; reward ``-(angle_normalize(theta)**2 +
    0.1 * theta_dot**2 + 0.001 * torque**2)`` (the last term within 1e-9, see the module
    docstring); never terminates. Reset: theta uniform in ``[-pi, pi)``, theta_dot in ``[-1, 1)``.

    Args:
        g: gravity (m/s^2), as the Gymnasium constructor argument.
    """

    state_dim = 2

    def __init__(self, num_envs: int, num_threads: int = 1, *, g: float = 10.0) -> None:
        m, l, dt = 1.0, 1.0, 0.05
        self.max_speed, self.max_torque = 8, 2.0
        high = np.array([1.0, 1.0, self.max_speed], dtype=_F32)
        self.action_space = gym.spaces.Box(low=-self.max_torque, high=self.max_torque, shape=(1,),
                                           dtype=_F32)
        self.observation_space = gym.spaces.Box(low=-high, high=high, dtype=_F32)
        super().__init__(num_envs, num_threads)
        self._gravity_coef = _c(3 * g / (2 * l))
        # Python floats times float32 ``u`` compute in float32 (NEP 50): float32 constants
        self._torque_coef, self._torque_cost = _F32(3.0 / (m * l**2)), _F32(0.001)
        self._dt, self._pi, self._two_pi = _c(dt), _c(np.pi), _c(2 * np.pi)
        self._speed_cost, self._low, self._high = _c(0.1), _c(-self.max_speed), _c(self.max_speed)
        self._reset_high = np.array([np.pi, 1.0])

    def _draw(self, rng):
        return rng.uniform(low=-self._reset_high, high=self._reset_high)

    def _observe(self, state, obs):
        np.cos(state[0], out=obs[:, 0], casting="same_kind")
        np.sin(state[0], out=obs[:, 1], casting="same_kind")
        obs[:, 2] = state[1]

    def _advance(self, state, ids, actions, obs, reward, terminated):
        th, thdot = state[0], state[1]
        u = actions[:, 0].astype(_F32)  # validated: clip(u, -2, 2) is the identity
        # costs = angle_normalize(th)**2 + 0.1 * thdot**2 + 0.001 * u**2
        an = th + self._pi
        an %= self._two_pi
        an -= self._pi
        costs = np.float_power(an, 2)  # NumPy-scalar x**2 is C pow(x, 2): float_power is too
        costs += self._speed_cost * np.float_power(thdot, 2)
        costs += self._torque_cost * np.square(u)  # float32 u**2, within 1 ulp (module doc)
        np.negative(costs, out=reward)
        # newthdot = thdot + (3 g / (2 l) * sin(th) + 3 / (m l^2) * u) * dt
        acc = np.sin(th)
        acc *= self._gravity_coef
        acc += self._torque_coef * u
        acc *= self._dt
        newthdot = np.add(thdot, acc, out=acc)
        np.maximum(newthdot, self._low, out=newthdot)  # np.clip(newthdot, -8, 8)
        np.minimum(newthdot, self._high, out=newthdot)
        state[0] += newthdot * self._dt
        state[1] = newthdot
        self._observe(state, obs)  # terminated stays all False


# --- Acrobot-v1 ----------------------------------------------------------------------------------
_LINK_MASS_1 = _LINK_MASS_2 = 1.0  # kg
_LINK_LENGTH_1 = 1.0  # m
_LINK_COM_POS_1 = _LINK_COM_POS_2 = 0.5  # m
_LINK_MOI = 1.0  # kg m^2
_ACROBOT_G = 9.8


class Acrobot(ClassicControlBatch):
    """Acrobot-v1 (``acrobot.py``, Sutton 1996): swing the tip of a two-link chain up.

    State ``[theta1, theta2 (rad), dtheta1, dtheta2 (rad/s)]`` integrated by one RK4 step of
    ``dt = 0.2`` s (the source's ``rk4`` over ``[0, dt]``), angles wrapped to ``[-pi, pi]``,
    velocities bounded to ``4 pi`` and ``9 pi``; observation ``[cos th1, sin th1, cos th2,
    sin th2, dth1, dth2]``; actions ``{0, 1, 2}`` = torque ``-1, 0, +1`` N m; reward -1 per step,
    0 on the terminating step; terminates when ``-cos th1 - cos(th1 + th2) > 1``.
    Reset: each variable uniform in ``[-0.1, 0.1)`` rounded to float32 (as the source).

    Args:
        book_or_nips: ``"book"`` (default, Sutton & Barto's equations) or ``"nips"`` (the 1996
            paper's, which omit a term), as the source's class attribute.
        torque_noise_max: uniform torque noise bound (N m), default 0; when > 0 each stepped
            env draws its noise from its own generator (a per-env loop, as the source's order).

    Raises:
        ValueError: unknown ``book_or_nips`` or a negative ``torque_noise_max``.
    """

    state_dim = 4
    MAX_VEL_1, MAX_VEL_2 = 4 * np.pi, 9 * np.pi

    def __init__(self, num_envs: int, num_threads: int = 1, *, book_or_nips: str = "book",
                 torque_noise_max: float = 0.0) -> None:
        if book_or_nips not in ("book", "nips"):
            raise ValueError(f"book_or_nips={book_or_nips!r} must be 'book' or 'nips'")
        if not torque_noise_max >= 0:
            raise ValueError(f"torque_noise_max={torque_noise_max!r} must be >= 0")
        high = np.array([1.0, 1.0, 1.0, 1.0, self.MAX_VEL_1, self.MAX_VEL_2], dtype=_F32)
        self.observation_space = gym.spaces.Box(low=-high, high=high, dtype=_F32)
        self.action_space = gym.spaces.Discrete(3)
        super().__init__(num_envs, num_threads)
        self.book_or_nips, self.torque_noise_max = book_or_nips, float(torque_noise_max)
        self._torque = np.array([-1.0, 0.0, 1.0])  # AVAIL_TORQUE
        # Constant factors of _dsdt, each folded exactly as Python evaluates the source
        # left to right (a product of leading constants is computed before the first array).
        m1, m2, l1 = _LINK_MASS_1, _LINK_MASS_2, _LINK_LENGTH_1
        lc1, lc2, i1, i2, g = _LINK_COM_POS_1, _LINK_COM_POS_2, _LINK_MOI, _LINK_MOI, _ACROBOT_G
        assert m2 == 2 * l1 * lc2 == 2 * m2 * l1 * lc2 == 1.0  # left out of _dsdt's products
        self._k = {name: _c(v) for name, v in dict(
            d1_a=m1 * lc1**2, d1_b=l1**2 + lc2**2, i1=i1, i2=i2, d2_a=lc2**2, d2_b=l1 * lc2,
            phi2=m2 * lc2 * g, half_pi=np.pi / 2.0, phi1_a=-m2 * l1 * lc2,
            phi1_c=(m1 * lc1 + m2 * l1) * g, half_pi_b=np.pi / 2, dd2_a=m2 * l1 * lc2,
            dd2_den=m2 * lc2**2 + i2).items()}
        dt = 0.2 - 0  # the source's dt = 0.2 s, as rk4 computes it from t = [0, dt]
        self._dt2, self._dt, self._dt6 = _c(dt / 2.0), _c(dt), _c(dt / 6.0)
        self._two, self._pi, self._two_pi = _c(2.0), _c(np.pi), _c(np.pi - -np.pi)
        self._neg_pi, self._one = _c(-np.pi), _c(1.0)
        self._bufs: dict[int, tuple] = {}

    def _draw(self, rng):
        return rng.uniform(low=-0.1, high=0.1, size=(4,)).astype(_F32)

    def _reset_observe(self, ids, state, obs):
        # the source's reset state is float32, so its first observation is float32 cos/sin
        self._observe(state.astype(_F32), obs)

    def _observe(self, state, obs):
        rows = np.empty((6, state.shape[1]), state.dtype)
        np.cos(state[:2], out=rows[0:4:2])
        np.sin(state[:2], out=rows[1:4:2])
        rows[4:] = state[2:]
        obs.T[...] = rows

    def _buffers(self, n: int) -> tuple:
        """Per batch size ``n``: the four RK4 slopes, the observation rows ``(6, n)`` and the
        velocity bounds ``(2, n)`` (full arrays: NumPy broadcasting costs more than it saves)."""
        bufs = self._bufs.get(n)
        if bufs is None:
            high = np.repeat([[self.MAX_VEL_1], [self.MAX_VEL_2]], n, axis=1)
            bufs = self._bufs[n] = (*(np.empty((4, n)) for _ in range(4)), np.empty((6, n)),
                                    -high, high)
        return bufs

    def _dsdt(self, s: np.ndarray, a: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``AcrobotEnv._dsdt`` for states ``s (4, n)`` and torques ``a (n,)``, into ``out``.

        The source's products by ``m2``, ``2 l1 lc2`` and ``2 m2 l1 lc2``, all exactly 1 here, are
        left out: ``x * 1.0 == x`` in IEEE arithmetic. Three products by ``sin th2`` are done as
        one over a stacked ``(3, n)`` array (elementwise, so the same roundings).
        """
        k = self._k
        theta1, theta2, dtheta1, dtheta2 = s
        cos2, sin2 = np.cos(theta2), np.sin(theta2)
        # d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos th2) + I1 + I2
        d1 = np.add(k["d1_b"], cos2)
        np.add(k["d1_a"], d1, out=d1)
        d1 += k["i1"]
        d1 += k["i2"]
        # d2 = m2 (lc2^2 + l1 lc2 cos th2) + I2
        d2 = np.multiply(k["d2_b"], cos2)
        d2 += k["d2_a"]
        d2 += k["i2"]
        # phi2 = m2 lc2 g cos(th1 + th2 - pi/2)
        phi2 = theta1 + theta2
        phi2 -= k["half_pi"]
        np.cos(phi2, out=phi2)
        phi2 *= k["phi2"]
        # [-m2 l1 lc2 dth2^2, 2 m2 l1 lc2 dth2 dth1, m2 l1 lc2 dth1^2 (book only)] * sin th2
        book = self.book_or_nips == "book"
        terms = np.empty((3 if book else 2, len(a)))
        np.float_power(dtheta2, 2, out=terms[0])
        terms[0] *= k["phi1_a"]
        np.multiply(dtheta2, dtheta1, out=terms[1])
        if book:
            np.float_power(dtheta1, 2, out=terms[2])
            terms[2] *= k["dd2_a"]
        terms *= sin2
        # phi1 = terms[0] - terms[1] + (m1 lc1 + m2 l1) g cos(th1 - pi/2) + phi2
        phi1 = np.subtract(terms[0], terms[1])
        t = np.subtract(theta1, k["half_pi_b"])
        np.cos(t, out=t)
        t *= k["phi1_c"]
        phi1 += t
        phi1 += phi2
        # ddth2 = (a + d2/d1 phi1 [- terms[2]] - phi2) / (m2 lc2^2 + I2 - d2^2 / d1)
        num = d2 / d1
        num *= phi1
        np.add(a, num, out=num)
        if book:
            num -= terms[2]
        num -= phi2
        den = np.float_power(d2, 2)
        den /= d1
        np.subtract(k["dd2_den"], den, out=den)
        ddtheta2 = np.divide(num, den, out=out[3])
        # ddth1 = -(d2 ddth2 + phi1) / d1
        ddtheta1 = np.multiply(d2, ddtheta2, out=out[2])
        ddtheta1 += phi1
        np.negative(ddtheta1, out=ddtheta1)
        ddtheta1 /= d1
        out[:2] = s[2:]
        return out

    def _advance(self, state, ids, actions, obs, reward, terminated):
        a = self._torque[actions]
        if self.torque_noise_max > 0:
            m = self.torque_noise_max
            a += np.array([self._rngs[i].uniform(-m, m) for i in ids.tolist()])
        k1, k2, k3, k4, rows, vel_low, vel_high = self._buffers(state.shape[1])
        dt2, dt = self._dt2, self._dt
        # rk4: y0 + dt/6 (k1 + 2 k2 + 2 k3 + k4), k_i at y0, y0 + dt/2 k1, y0 + dt/2 k2, y0 + dt k3
        self._dsdt(state, a, k1)
        self._dsdt(state + dt2 * k1, a, k2)
        self._dsdt(state + dt2 * k2, a, k3)
        self._dsdt(state + dt * k3, a, k4)
        k2 *= self._two
        k1 += k2
        k3 *= self._two
        k1 += k3
        k1 += k4
        k1 *= self._dt6
        state += k1
        # wrap both angles into [-pi, pi] (the source's while loops; |x| > pi <=> x > pi or
        # x < -pi), bound both velocities (the source's min(max(x, -max_vel), max_vel))
        angles = state[:2]
        if np.count_nonzero(np.abs(angles) > self._pi):
            over = angles > self._pi
            while np.count_nonzero(over):
                np.subtract(angles, self._two_pi, out=angles, where=over)
                np.greater(angles, self._pi, out=over)
            under = np.less(angles, self._neg_pi, out=over)
            while np.count_nonzero(under):
                np.add(angles, self._two_pi, out=angles, where=under)
                np.less(angles, self._neg_pi, out=under)
        velocities = state[2:]
        np.maximum(velocities, vel_low, out=velocities)
        np.minimum(velocities, vel_high, out=velocities)
        # observation rows [cos th1, sin th1, cos th2, sin th2, dth1, dth2]
        np.cos(angles, out=rows[0:4:2])
        np.sin(angles, out=rows[1:4:2])
        rows[4:] = velocities
        obs.T[...] = rows
        # terminal: -cos(th1) - cos(th2 + th1) > 1
        height = np.negative(rows[0])
        height -= np.cos(state[1] + state[0])
        np.greater(height, self._one, out=terminated)
        np.subtract(terminated, self._one, out=reward)  # -1, or 0 when terminated


def _mountain_car_space(env) -> gym.spaces.Box:
    low = np.array([env.min_position, -env.max_speed], dtype=_F32)
    high = np.array([env.max_position, env.max_speed], dtype=_F32)
    return gym.spaces.Box(low, high, dtype=_F32)


# --- MountainCar-v0 ------------------------------------------------------------------------------
class MountainCar(ClassicControlBatch):
    """MountainCar-v0 (``mountain_car.py``, Moore 1990): drive an underpowered car up a hill.

    State/observation ``[position (m), velocity (m/step)]``; actions ``{0: push left, 1: none,
    2: push right}``; reward -1 per step; terminates at ``position >= 0.5`` with
    ``velocity >= goal_velocity``. Reset: position uniform in ``[-0.6, -0.4)``, velocity 0.

    Args:
        goal_velocity: as the Gymnasium constructor argument.
    """

    state_dim = 2

    def __init__(self, num_envs: int, num_threads: int = 1, *, goal_velocity: float = 0) -> None:
        self.min_position, self.max_position, self.max_speed = -1.2, 0.6, 0.07
        self.goal_position, self.goal_velocity = 0.5, goal_velocity
        self.action_space = gym.spaces.Discrete(3)
        self.observation_space = _mountain_car_space(self)
        super().__init__(num_envs, num_threads)
        force, gravity = 0.001, 0.0025
        self._push = np.array([(a - 1) * force for a in range(3)])
        self._three, self._neg_gravity = _c(3), _c(-gravity)
        self._k = {name: _c(v) for name, v in dict(
            v_min=-self.max_speed, v_max=self.max_speed, p_min=self.min_position,
            p_max=self.max_position, goal_p=self.goal_position, goal_v=goal_velocity,
            zero=0.0).items()}
        self._reward[:] = -1.0

    def _draw(self, rng):
        return np.array([rng.uniform(low=-0.6, high=-0.4), 0])

    def _advance(self, state, ids, actions, obs, reward, terminated):
        k = self._k
        position, velocity = state[0], state[1]
        # velocity += (action - 1) * force + cos(3 * position) * (-gravity)
        dv = np.multiply(self._three, position)
        np.cos(dv, out=dv)
        dv *= self._neg_gravity
        np.add(self._push[actions], dv, out=dv)
        velocity += dv
        np.maximum(velocity, k["v_min"], out=velocity)  # np.clip(velocity, -0.07, 0.07)
        np.minimum(velocity, k["v_max"], out=velocity)
        position += velocity
        np.maximum(position, k["p_min"], out=position)  # np.clip(position, -1.2, 0.6)
        np.minimum(position, k["p_max"], out=position)
        _left_wall_and_goal(position, velocity, terminated, k)
        obs.T[...] = state


# --- MountainCarContinuous-v0 --------------------------------------------------------------------
class MountainCarContinuous(ClassicControlBatch):
    """MountainCarContinuous-v0 (``continuous_mountain_car.py``): the continuous-force variant.

    State/observation ``[position (m), velocity (m/step)]``; action ``(1,)`` force in ``[-1, 1]``;
    reward ``-0.1 * force**2`` per step plus 100 on reaching ``position >= 0.45`` with
    ``velocity >= goal_velocity`` (terminates). Reset: position uniform in ``[-0.6, -0.4)``,
    velocity 0.

    The source stores its state as float32 after every step, so the step after a reset computes
    in float64 (the reset state is float64) and every later one in float32 where the source's
    NumPy-scalar arithmetic does (``3 * position``, ``force * power - 0.0025 * cos``, the velocity
    and position updates); this class keeps the same dtypes per env.

    Args:
        goal_velocity: as the Gymnasium constructor argument.
    """

    state_dim = 2

    def __init__(self, num_envs: int, num_threads: int = 1, *, goal_velocity: float = 0) -> None:
        self.min_position, self.max_position, self.max_speed = -1.2, 0.6, 0.07
        self.goal_position, self.goal_velocity, self.power = 0.45, goal_velocity, 0.0015
        self.action_space = gym.spaces.Box(low=-1.0, high=1.0, shape=(1,), dtype=_F32)
        self.observation_space = _mountain_car_space(self)
        super().__init__(num_envs, num_threads)
        self._fresh = np.zeros(self.num_envs, bool)  # reset, not stepped since: float64 state
        # the source's Python constants in each dtype its NumPy scalars compute in
        self._k = {dtype: {name: np.array(v, dtype) for name, v in dict(
            three=3, v_min=-self.max_speed, v_max=self.max_speed, p_min=self.min_position,
            p_max=self.max_position, goal_p=self.goal_position, goal_v=goal_velocity,
            zero=0).items()} for dtype in (_F32, _F64)}
        self._power, self._cos_coef = _F32(self.power), _c(0.0025)
        self._goal_reward, self._action_cost = _c(100.0), _c(0.1)

    def _draw(self, rng):
        return np.array([rng.uniform(low=-0.6, high=-0.4), 0])

    def _reset_observe(self, ids, state, obs):
        self._fresh[ids] = True
        self._observe(state, obs)

    def _advance(self, state, ids, actions, obs, reward, terminated):
        force = actions[:, 0].astype(_F32)  # validated: min(max(f, -1), 1) is the identity
        fresh = self._fresh.take(ids)
        if np.count_nonzero(fresh):
            self._fresh[ids] = False
            old = ~fresh
            for mask, dtype in ((fresh, _F64), (old, _F32)):
                if np.count_nonzero(mask):
                    s = state[:, mask]
                    term = np.empty(len(s[0]), bool)
                    self._dynamics(s, dtype, force[mask], term)
                    state[:, mask] = s
                    terminated[mask] = term
        else:
            self._dynamics(state, _F32, force, terminated)
        # reward = 100 * terminated - math.pow(force, 2) * 0.1 (exact: a float32 squared in
        # float64 is exact, so C pow returns it exactly)
        f64 = force.astype(_F64)
        f64 *= f64
        f64 *= self._action_cost
        np.multiply(terminated, self._goal_reward, out=reward)
        reward -= f64
        obs.T[...] = state

    def _dynamics(self, state, dtype, force, terminated):
        """The source's step on ``state (2, n)`` whose values are of ``dtype``, in place."""
        k = self._k[dtype]
        position, velocity = state.astype(dtype)
        # velocity += force * power - 0.0025 * math.cos(3 * position): the Python float
        # 0.0025 * cos(...) is cast to force's float32 before the subtraction (NEP 50)
        cos = np.multiply(k["three"], position).astype(_F64)
        np.cos(cos, out=cos)
        cos *= self._cos_coef
        dv = np.multiply(force, self._power)
        dv -= cos.astype(_F32)
        velocity = velocity + dv
        np.minimum(velocity, k["v_max"], out=velocity)  # if velocity > max_speed: max_speed
        np.maximum(velocity, k["v_min"], out=velocity)
        position += velocity
        np.minimum(position, k["p_max"], out=position)
        np.maximum(position, k["p_min"], out=position)
        _left_wall_and_goal(position, velocity, terminated, k)
        # the source stores np.array([position, velocity], dtype=float32)
        state[0] = position.astype(_F32)
        state[1] = velocity.astype(_F32)


# --- registration --------------------------------------------------------------------------------
#: task id -> (class, Gymnasium's max_episode_steps for that id)
TASKS: dict[str, tuple[type[ClassicControlBatch], int]] = {
    "CartPole-v1": (CartPole, 500),
    "Pendulum-v1": (Pendulum, 200),
    "Acrobot-v1": (Acrobot, 500),
    "MountainCar-v0": (MountainCar, 200),
    "MountainCarContinuous-v0": (MountainCarContinuous, 999),
}


def make_batch(task_id: str, num_envs: int, num_threads: int = 1, **kwargs) -> ClassicControlBatch:
    """Build the `BatchedEnv` of ``task_id`` (a key of `TASKS`) with ``num_envs`` envs.

    Raises:
        ValueError: unknown ``task_id``, or a keyword the task does not take (all named).
    """
    if task_id not in TASKS:
        raise ValueError(f"task_id={task_id!r} is not a native classic control task: {list(TASKS)}")
    cls = TASKS[task_id][0]
    params = inspect.signature(cls.__init__).parameters
    accepted = [p.name for p in params.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(f"{task_id} does not take the keyword(s) {unknown}; it takes {accepted}")
    return cls(num_envs, num_threads, **kwargs)


def engines() -> dict[str, dict[str, EngineEntry]]:
    """The ``numpy`` engine of each task of `TASKS`, with Gymnasium's time limits (the
    registry's table: task id -> engine name -> `EngineEntry`)."""
    return {task_id: {"numpy": stepped(functools.partial(make_batch, task_id), max_steps)}
            for task_id, (_, max_steps) in TASKS.items()}


def _left_wall_and_goal(position: np.ndarray, velocity: np.ndarray, terminated: np.ndarray,
                        k: dict) -> None:
    """Both MountainCars: stop at the left wall (``position == min_position and velocity < 0``
    gives ``velocity = 0``) and terminate at the goal (position and velocity thresholds)."""
    stopped = np.equal(position, k["p_min"])
    stopped &= np.less(velocity, k["zero"])
    np.copyto(velocity, k["zero"], where=stopped)
    np.greater_equal(position, k["goal_p"], out=terminated)
    terminated &= np.greater_equal(velocity, k["goal_v"])
