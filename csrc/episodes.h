// Episode bookkeeping shared by the native cores: the C++ form of gmi_drl/envs/stepper.py's
// `Stepper` (running totals of the current episode, the pool's time limit, which envs await
// their reset), so every engine reports episodes identically.

#pragma once

#include <cstdint>
#include <vector>

namespace gmi_drl {

enum Autoreset { kNextStep = 0, kSameStep = 1, kDisabled = 2 };  // AutoresetMode's order

class Episodes {
 public:
  // One env step as the pool reports it: totals of the episode including this step.
  struct Step {
    double episode_return;
    int64_t episode_length;
    bool truncated;  // by the env itself or the time limit
    bool done;       // terminated or truncated
  };

  Episodes(int num_envs, int autoreset, int64_t max_episode_steps)
      : mode(autoreset), max_steps_(max_episode_steps), return_(num_envs, 0.0),
        length_(num_envs, 0), ended_(num_envs, 0) {}

  // Count a step of env i (`truncated`: the env cut the episode itself; the time limit is added
  // here). When the episode ends, the running totals restart and, unless the mode is same_step
  // (the caller resets at once), env i awaits its reset.
  Step record(int i, double reward, bool terminated, bool truncated = false) {
    Step s{return_[i] + reward, length_[i] + 1, false, false};
    s.truncated = truncated || (max_steps_ > 0 && s.episode_length >= max_steps_);
    s.done = terminated || s.truncated;
    return_[i] = s.done ? 0.0 : s.episode_return;
    length_[i] = s.done ? 0 : s.episode_length;
    if (s.done && mode != kSameStep) ended_[i] = 1;
    return s;
  }

  void start(int i) {  // a new episode of env i
    return_[i] = 0.0;
    length_[i] = 0;
    ended_[i] = 0;
  }

  bool ended(int i) const { return ended_[i]; }

  const int mode;

 private:
  const int64_t max_steps_;
  std::vector<double> return_;
  std::vector<int64_t> length_;
  std::vector<char> ended_;  // char, not vector<bool>: envs on different threads
};

}  // namespace gmi_drl
