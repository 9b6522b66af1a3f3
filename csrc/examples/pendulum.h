// Pendulum-v1 written against the C++ env template (csrc/env_template.h) alone: Gymnasium's
// gymnasium/envs/classic_control/pendulum.py, its operations in the same order and dtypes (the
// torque is float32, so `3.0 * u` and `0.001 * u**2` are float32 products, as NumPy computes
// them for a float32 scalar times a Python float). Only the reset draws differ: Gymnasium draws
// from NumPy's generator, this env from SplitMix64 (`gmi_drl::next_seed`) of its reset seed.
// tests/envs/test_cpp_env.py steps it against Gymnasium's env from the same state.

#pragma once

#include "../env_template.h"

#include <cmath>
#include <cstdint>

namespace gmi_drl_examples {

class Pendulum {
 public:
  using Obs = float;

  // Options: "g", gravity in m/s^2 (Gymnasium's constructor argument).
  explicit Pendulum(const gmi_drl::Options& options) : g_(options.get("g", 10.0)) {}

  gmi_drl::EnvSpec spec() const {
    gmi_drl::EnvSpec s;
    s.obs_shape = {3};                     // [cos theta, sin theta, theta_dot]
    s.obs_low = {-1.0, -1.0, -kMaxSpeed};
    s.obs_high = {1.0, 1.0, kMaxSpeed};
    s.action_low = {-kMaxTorque};          // torque, N m
    s.action_high = {kMaxTorque};
    s.max_episode_steps = 200;
    return s;
  }

  // theta uniform in [-pi, pi), theta_dot in [-1, 1): `low + (high - low) * u`, u the top 53
  // bits of the next two SplitMix64 outputs after `seed`, times 2^-53.
  void reset(uint64_t seed, gmi_drl::ObsOut<Obs>& obs) {
    const uint64_t a = gmi_drl::next_seed(seed), b = gmi_drl::next_seed(a);
    th_ = -kPi + (kPi - -kPi) * unit(a);
    thdot_ = -1.0 + (1.0 - -1.0) * unit(b);
    observe(obs);
  }

  gmi_drl::StepResult step(const gmi_drl::Action& action, gmi_drl::ObsOut<Obs>& obs) {
    float u = static_cast<float>(action[0]);  // np.clip(u, -2, 2)[0], float32
    u = u < -2.0f ? -2.0f : (u > 2.0f ? 2.0f : u);
    const double an = angle_normalize(th_);
    const float torque_cost = 0.001f * (u * u);
    const double costs = (an * an + 0.1 * (thdot_ * thdot_)) + static_cast<double>(torque_cost);
    // newthdot = thdot + (3 g / (2 l) * sin(th) + 3 / (m l^2) * u) * dt, m = l = 1, dt = 0.05
    double newthdot =
        thdot_ + (3.0 * g_ / 2.0 * std::sin(th_) + static_cast<double>(3.0f * u)) * kDt;
    newthdot = newthdot < -kMaxSpeed ? -kMaxSpeed : (newthdot > kMaxSpeed ? kMaxSpeed : newthdot);
    th_ = th_ + newthdot * kDt;
    thdot_ = newthdot;
    observe(obs);
    return {-costs, false, false};
  }

 private:
  static constexpr double kPi = 3.141592653589793;
  static constexpr double kMaxSpeed = 8.0, kMaxTorque = 2.0, kDt = 0.05;

  static double unit(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

  // ((x + pi) % (2 pi)) - pi with Python's (NumPy's) modulo: the sign of the divisor
  static double angle_normalize(double x) {
    const double b = 2 * kPi;
    double m = std::fmod(x + kPi, b);
    if (m != 0.0) {
      if ((m < 0) != (b < 0)) m += b;
    } else {
      m = std::copysign(0.0, b);
    }
    return m - kPi;
  }

  void observe(gmi_drl::ObsOut<Obs>& obs) const {
    obs[0] = static_cast<float>(std::cos(th_));
    obs[1] = static_cast<float>(std::sin(th_));
    obs[2] = static_cast<float>(thdot_);
  }

  double g_;
  double th_ = 0.0, thdot_ = 0.0;
};

}  // namespace gmi_drl_examples
