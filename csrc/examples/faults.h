// Envs that break the template's contract on purpose, one way each, so that
// tests/envs/test_cpp_env.py can check the pool's errors: each declares a 3-value obs and a
// 1-value action in its spec.

#pragma once

#include "../env_template.h"

#include <cstdint>

namespace gmi_drl_examples {

// Mode 0: step writes a 4th obs value; 1: step writes 2 of 3; 2: step reads action[1];
// 3: reset writes 2 of 3; 4: the spec gives 1 action_low and 2 action_high bounds.
template <int kMode>
class Faulty {
 public:
  using Obs = float;

  explicit Faulty(const gmi_drl::Options&) {}

  gmi_drl::EnvSpec spec() const {
    gmi_drl::EnvSpec s;
    s.obs_shape = {3};
    s.action_low = {-1.0};
    s.action_high = {1.0};
    if (kMode == 4) s.action_high.push_back(1.0);
    s.max_episode_steps = 50;
    return s;
  }

  void reset(uint64_t, gmi_drl::ObsOut<Obs>& obs) {
    obs[0] = obs[1] = 0.0f;
    if (kMode != 3) obs[2] = 0.0f;
  }

  gmi_drl::StepResult step(const gmi_drl::Action& action, gmi_drl::ObsOut<Obs>& obs) {
    if (++steps_ < 3) return ok(action, obs);  // a few good steps first
    switch (kMode) {
      case 0: obs.set({0.0, 0.0, 0.0, 0.0}); break;
      case 1: obs[0] = obs[1] = 0.0f; break;
      case 2: obs.set({action[0], action[1], 0.0}); break;
      default: return ok(action, obs);
    }
    return {};
  }

 private:
  static gmi_drl::StepResult ok(const gmi_drl::Action& action, gmi_drl::ObsOut<Obs>& obs) {
    obs.set({action[0], 0.0, 0.0});
    return {0.0, false, false};
  }

  int steps_ = 0;
};

}  // namespace gmi_drl_examples
