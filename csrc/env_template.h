// The C++ env template: write one env class against this header and the pool's worker threads
// run it, batched, zero-copy, with EnvPool's send/recv and the engine's autoreset modes
// (docs/add-a-cpp-env.md walks through it; csrc/examples/pendulum.cpp is a complete example).
//
// An env is a class `E` with
//
//   using Obs = float;                         // observation dtype: float, double, uint8_t,
//                                              // int32_t or int64_t
//   explicit E(const gmi_drl::Options& opts);  // keyword options: opts.get("g", 10.0)
//   gmi_drl::EnvSpec spec() const;             // spaces and time limit (below)
//   void reset(uint64_t seed, gmi_drl::ObsOut<Obs>& obs);   // start an episode, write its obs
//   gmi_drl::StepResult step(const gmi_drl::Action& action, gmi_drl::ObsOut<Obs>& obs);
//
// and a module line `GMI_DRL_ENV_MODULE(_my_env, E)` in its .cpp, built by setup.py's
// `template_env(...)`; `gmi_drl.envs.register_cpp("MyEnv-v0", "gmi_drl.envs._my_env")` then
// registers it for `gmi_drl.envs.make` and every face.
//
// Each env id owns one `E`; the pool never calls two methods of one `E` at once, but calls
// different envs' methods on different threads at the same time: an `E` must not share mutable
// state with another. `reset` and `step` must write every value of the observation (checked:
// a write outside the spec's obs size, a read outside the action, or an obs left partly
// unwritten is an error naming the env, the method and the sizes; the pool raises it from
// `recv`/`reset` and stops its threads). Reset seeds: an env's first reset gets its pool seed
// (`make(..., seed=s)`: `s + env_id`); each later reset gets `next_seed(previous seed)`, so a
// pool's trajectories depend on its seed alone.

#pragma once

#include "episodes.h"
#include "py_buffers.h"
#include "work_queue.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gmi_drl {

// What a pool knows about an env before stepping it (Gymnasium's spaces, single-env).
struct EnvSpec {
  std::vector<int64_t> obs_shape;          // e.g. {3}; the obs holds their product of values
  std::vector<double> obs_low, obs_high;   // one bound per obs value, or empty: the dtype's range
  int64_t num_actions = 0;                 // > 0: Discrete(num_actions), actions 0..n-1
  std::vector<double> action_low, action_high;  // num_actions == 0: Box(low, high) float32
                                                // with action_low.size() values per action
  int64_t max_episode_steps = 0;           // the pool's time limit in steps; 0: none
};

// One step's outcome (the observation goes to the `ObsOut` given to `step`).
struct StepResult {
  double reward = 0.0;
  bool terminated = false;  // the MDP ended (a terminal state)
  bool truncated = false;   // the env cut the episode short itself (the pool adds its time limit)
};

// The keyword options of `gmi_drl.envs.make(task_id, n, **options)` (numbers). An option no
// env reads is refused when the pool is made, naming it.
class Options {
 public:
  explicit Options(std::map<std::string, double> values = {}) : values_(std::move(values)) {}

  double get(const std::string& name, double default_value) const {
    read_.insert(name);
    auto it = values_.find(name);
    return it == values_.end() ? default_value : it->second;
  }

  // The names given but never read, sorted.
  std::vector<std::string> unread() const {
    std::vector<std::string> out;
    for (const auto& kv : values_)
      if (!read_.count(kv.first)) out.push_back(kv.first);
    return out;
  }

 private:
  std::map<std::string, double> values_;
  mutable std::set<std::string> read_;
};

// One env's action: `action[k]` (Box, float32 widened to double) or `action.index()`
// (Discrete); anything else throws std::out_of_range naming the sizes.
class Action {
 public:
  Action(const float* box, std::size_t size, int64_t index)
      : box_(box), size_(size), index_(index) {}

  double operator[](std::size_t k) const {
    if (box_ == nullptr)
      throw std::out_of_range("step read action[" + std::to_string(k) + "] of a Discrete "
                              "action: use action.index()");
    if (k >= size_)
      throw std::out_of_range("step read action[" + std::to_string(k) + "] but the spec's "
                              "action has " + std::to_string(size_) + " value(s)");
    return box_[k];
  }

  int64_t index() const {
    if (box_ != nullptr)
      throw std::out_of_range("step called action.index() on a Box action: use action[k]");
    return index_;
  }

  std::size_t size() const { return box_ == nullptr ? 1 : size_; }

 private:
  const float* box_;  // null: Discrete
  std::size_t size_;
  int64_t index_;
};

// The observation row an env writes, `obs[k] = v` or `obs.set({...})`: checked against the
// spec's obs size, and the pool checks after each call that every value was written.
template <typename T>
class ObsOut {
 public:
  ObsOut(T* data, std::size_t size) : data_(data), size_(size), written_(size, 0) {}

  T& operator[](std::size_t k) {
    if (k >= size_)
      throw std::out_of_range("wrote obs[" + std::to_string(k) + "] but the spec's obs has " +
                              std::to_string(size_) + " value(s)");
    written_[k] = 1;
    return data_[k];
  }

  void set(std::initializer_list<double> values) {
    if (values.size() != size_)
      throw std::out_of_range("wrote " + std::to_string(values.size()) + " obs value(s) but the "
                              "spec's obs has " + std::to_string(size_));
    std::size_t k = 0;
    for (double v : values) (*this)[k++] = static_cast<T>(v);
  }

  std::size_t size() const { return size_; }

  // Throws naming `method` unless every value was written; then forgets the writes.
  void check_complete(const char* method) {
    const auto n = static_cast<std::size_t>(std::count(written_.begin(), written_.end(), 1));
    if (n != size_)
      throw std::out_of_range(std::string(method) + " wrote " + std::to_string(n) + " of the " +
                              std::to_string(size_) + " obs value(s) the spec declares");
    std::fill(written_.begin(), written_.end(), 0);
  }

 private:
  T* data_;
  std::size_t size_;
  std::vector<char> written_;
};

// The seed of an env's next reset after one with `seed`: SplitMix64 (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", OOPSLA 2014), one step.
inline uint64_t next_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The spec's problems (empty: none): what a pool refuses before starting a thread.
inline std::string spec_problem(const EnvSpec& s) {
  if (s.obs_shape.empty()) return "obs_shape is empty";
  int64_t n = 1;
  for (int64_t d : s.obs_shape) {
    if (d < 1) return "obs_shape has a dimension < 1";
    n *= d;
  }
  if (!s.obs_low.empty() || !s.obs_high.empty()) {
    if (static_cast<int64_t>(s.obs_low.size()) != n || s.obs_high.size() != s.obs_low.size())
      return "obs_low and obs_high must hold one bound per obs value (" + std::to_string(n) +
             ") or be empty";
  }
  if (s.num_actions < 0) return "num_actions < 0";
  if (s.num_actions == 0) {
    if (s.action_low.empty() || s.action_low.size() != s.action_high.size())
      return "a Box action needs action_low and action_high of one equal, non-zero size";
    for (std::size_t k = 0; k < s.action_low.size(); ++k)
      if (!(s.action_low[k] <= s.action_high[k])) return "action_low > action_high";
  } else if (!s.action_low.empty() || !s.action_high.empty()) {
    return "a Discrete action (num_actions > 0) has no action_low/action_high";
  }
  if (s.max_episode_steps < 0) return "max_episode_steps < 0";
  return "";
}

inline int64_t obs_size(const EnvSpec& s) {
  int64_t n = 1;
  for (int64_t d : s.obs_shape) n *= d;
  return n;
}

// A pool of `E`s on a `WorkQueue`: the pool's per-env state buffers (NumPy arrays Python owns)
// are written in place; see gmi_drl/envs/cpp_env.py for the Python side.
template <typename E>
class TemplatePool {
 public:
  using Obs = typename E::Obs;

  TemplatePool(int num_envs, int num_threads, int autoreset, int64_t max_episode_steps,
               pybind11::array_t<int64_t, pybind11::array::c_style> seeds,
               pybind11::dict buffers, std::map<std::string, double> options)
      : n_(num_envs), episodes_(num_envs, autoreset, max_episode_steps) {
    if (n_ < 1 || num_threads < 1) throw std::invalid_argument("num_envs and num_threads >= 1");
    if (seeds.ndim() != 1 || seeds.shape(0) != n_)
      throw std::invalid_argument("seeds must have shape (num_envs,)");
    Options opts(std::move(options));
    envs_.reserve(n_);
    for (int i = 0; i < n_; ++i) envs_.emplace_back(opts);
    check_options(opts);
    spec_ = envs_[0].spec();
    const std::string problem = spec_problem(spec_);
    if (!problem.empty()) throw std::invalid_argument("invalid EnvSpec: " + problem);
    dim_ = obs_size(spec_);
    act_dim_ = spec_.num_actions > 0 ? 1 : static_cast<int64_t>(spec_.action_low.size());
    bufs_ = buffers;
    obs_ = buffer<Obs>(buffers, "obs", n_, dim_);
    final_obs_ = buffer<Obs>(buffers, "final_obs", n_, dim_);
    reward_ = buffer<double>(buffers, "reward", n_, 1);
    terminated_ = buffer<bool>(buffers, "terminated", n_, 1);
    truncated_ = buffer<bool>(buffers, "truncated", n_, 1);
    ep_return_ = buffer<double>(buffers, "episode_return", n_, 1);
    ep_length_ = buffer<int64_t>(buffers, "episode_length", n_, 1);
    seed_.assign(seeds.data(), seeds.data() + n_);
    box_.assign(static_cast<std::size_t>(n_) * act_dim_, 0.0f);
    index_.assign(n_, 0);
    reset_once_.assign(n_, 0);
    queue_ = std::make_unique<WorkQueue>(num_threads, [this](int i) { return run(i); });
  }

  ~TemplatePool() { close(); }

  const EnvSpec& spec() const { return spec_; }

  void pin(const std::vector<int>& cores) const {
    if (!queue_) throw std::runtime_error("the core is closed");
    queue_->pin(cores);
  }

  void close() {
    if (!queue_) return;
    queue_->stop();
    queue_.reset();
  }

  // Queue `ids (n,)` with `actions`: (n, action dims) float32 for a Box, (n,) int64 for a
  // Discrete; returns at once.
  void send(pybind11::array_t<int64_t, pybind11::array::c_style> ids, pybind11::array actions) {
    if (!queue_) throw std::runtime_error("the core is closed");
    const pybind11::ssize_t n = ids.shape(0);
    const int64_t* id = ids.data();
    for (pybind11::ssize_t k = 0; k < n; ++k)
      if (id[k] < 0 || id[k] >= n_) throw std::invalid_argument("env id out of range");
    if (spec_.num_actions > 0) {
      if (!pybind11::isinstance<pybind11::array_t<int64_t>>(actions) || actions.ndim() != 1 ||
          actions.shape(0) != n)
        throw std::invalid_argument("Discrete actions must be int64 of shape (len(ids),)");
      auto a = actions.unchecked<int64_t, 1>();
      for (pybind11::ssize_t k = 0; k < n; ++k) index_[id[k]] = a(k);
    } else {
      if (!pybind11::isinstance<pybind11::array_t<float>>(actions) || actions.ndim() != 2 ||
          actions.shape(0) != n || actions.shape(1) != act_dim_)
        throw std::invalid_argument("Box actions must be float32 of shape (len(ids), " +
                                    std::to_string(act_dim_) + ")");
      auto a = actions.unchecked<float, 2>();
      for (pybind11::ssize_t k = 0; k < n; ++k)
        for (int64_t j = 0; j < act_dim_; ++j) box_[id[k] * act_dim_ + j] = a(k, j);
    }
    queue_->push(id, static_cast<std::size_t>(n));
  }

  pybind11::array_t<int64_t> wait(int min_count) { return wait_ids(queue_.get(), min_count); }

  // Reset `ids` (none in flight) in the calling thread, the GIL released; `seeds (n,)`: a seed
  // per id, or -1 to continue that env's seed chain (`next_seed`).
  void reset(pybind11::array_t<int64_t, pybind11::array::c_style> ids,
             pybind11::array_t<int64_t, pybind11::array::c_style> seeds) {
    const int64_t* id = ids.data();
    const int64_t* seed = seeds.data();
    if (seeds.shape(0) != ids.shape(0)) throw std::invalid_argument("one seed per id");
    for (pybind11::ssize_t k = 0; k < ids.shape(0); ++k)
      if (id[k] < 0 || id[k] >= n_) throw std::invalid_argument("env id out of range");
    if (!queue_ || !queue_->enter()) throw std::runtime_error("the core is closed");
    std::string error;
    {
      pybind11::gil_scoped_release release;
      for (pybind11::ssize_t k = 0; k < ids.shape(0) && error.empty(); ++k) {
        const int i = static_cast<int>(id[k]);
        try {
          if (seed[k] >= 0) {
            seed_[i] = static_cast<uint64_t>(seed[k]);
            reset_once_[i] = 0;  // this seed is the next reset's own
          }
          start(i);
        } catch (const std::exception& e) {
          error = "env_id " + std::to_string(i) + ": " + e.what();
        }
      }
      queue_->leave();
    }
    if (!error.empty()) throw std::runtime_error(error);
  }

 private:
  void check_options(const Options& opts) {
    const auto unread = opts.unread();
    if (unread.empty()) return;
    std::string names;
    for (const auto& u : unread) names += (names.empty() ? "'" : ", '") + u + "'";
    throw std::invalid_argument("the env does not take the option(s) [" + names + "]");
  }

  // A new episode of env i, from its next seed (the first reset: its own).
  void start(int i) {
    if (reset_once_[i]) seed_[i] = next_seed(seed_[i]);
    reset_once_[i] = 1;
    ObsOut<Obs> o(obs_ + static_cast<std::size_t>(i) * dim_, static_cast<std::size_t>(dim_));
    envs_[i].reset(seed_[i], o);
    o.check_complete("reset");
    reward_[i] = 0.0;
    terminated_[i] = truncated_[i] = false;
    ep_return_[i] = 0.0;
    ep_length_[i] = 0;
    episodes_.start(i);
  }

  std::string run(int i) {
    try {
      step(i);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }

  void step(int i) {
    if (episodes_.ended(i)) {  // next_step autoreset: this step only starts the new episode
      start(i);
      return;
    }
    Obs* row = obs_ + static_cast<std::size_t>(i) * dim_;
    ObsOut<Obs> o(row, static_cast<std::size_t>(dim_));
    const Action a = spec_.num_actions > 0
        ? Action(nullptr, 1, index_[i])
        : Action(&box_[static_cast<std::size_t>(i) * act_dim_],
                 static_cast<std::size_t>(act_dim_), 0);
    const StepResult r = envs_[i].step(a, o);
    o.check_complete("step");
    const Episodes::Step e = episodes_.record(i, r.reward, r.terminated, r.truncated);
    reward_[i] = r.reward;
    terminated_[i] = r.terminated;
    truncated_[i] = e.truncated;
    ep_return_[i] = e.episode_return;
    ep_length_[i] = e.episode_length;
    if (e.done && episodes_.mode == kSameStep) {
      std::copy(row, row + dim_, final_obs_ + static_cast<std::size_t>(i) * dim_);
      start(i);
      // start() zeroed the step's outputs: the step's own stay
      reward_[i] = r.reward;
      terminated_[i] = r.terminated;
      truncated_[i] = e.truncated;
      ep_return_[i] = e.episode_return;
      ep_length_[i] = e.episode_length;
    }
  }

  pybind11::dict bufs_;  // keeps the state buffers alive
  int n_;
  int64_t dim_ = 0, act_dim_ = 0;
  EnvSpec spec_;
  Episodes episodes_;
  std::vector<E> envs_;
  Obs *obs_ = nullptr, *final_obs_ = nullptr;
  double *reward_ = nullptr, *ep_return_ = nullptr;
  bool *terminated_ = nullptr, *truncated_ = nullptr;
  int64_t* ep_length_ = nullptr;
  std::vector<uint64_t> seed_;
  std::vector<char> reset_once_;  // char, not vector<bool>: envs on different threads
  std::vector<float> box_;
  std::vector<int64_t> index_;
  std::unique_ptr<WorkQueue> queue_;  // last: its threads stop before the rest goes
};

// The spec as a dict for Python (gmi_drl/envs/cpp_env.py builds the spaces from it).
inline pybind11::dict spec_dict(const EnvSpec& s, const pybind11::dtype& obs_dtype) {
  pybind11::dict d;
  d["obs_shape"] = s.obs_shape;
  d["obs_dtype"] = obs_dtype;
  d["obs_low"] = s.obs_low;
  d["obs_high"] = s.obs_high;
  d["num_actions"] = s.num_actions;
  d["action_low"] = s.action_low;
  d["action_high"] = s.action_high;
  d["max_episode_steps"] = s.max_episode_steps;
  return d;
}

// The module's contents: `spec(options) -> dict` (raises ValueError for a bad spec or an
// unknown option) and the class `Pool`.
template <typename E>
void bind_env(pybind11::module_& m, const char* doc) {
  namespace py = pybind11;
  using P = TemplatePool<E>;
  m.doc() = doc;
  m.attr("TEMPLATE_VERSION") = 1;
  m.def("spec", [](std::map<std::string, double> options) {
    Options opts(std::move(options));
    E env(opts);
    const auto unread = opts.unread();
    if (!unread.empty()) {
      std::string names;
      for (const auto& u : unread) names += (names.empty() ? "'" : ", '") + u + "'";
      throw std::invalid_argument("the env does not take the option(s) [" + names + "]");
    }
    const EnvSpec s = env.spec();
    const std::string problem = spec_problem(s);
    if (!problem.empty()) throw std::invalid_argument("invalid EnvSpec: " + problem);
    return spec_dict(s, py::dtype::of<typename E::Obs>());
  }, py::arg("options"));
  py::class_<P>(m, "Pool")
      .def(py::init<int, int, int, int64_t, py::array_t<int64_t, py::array::c_style>, py::dict,
                    std::map<std::string, double>>(),
           py::arg("num_envs"), py::arg("num_threads"), py::arg("autoreset"),
           py::arg("max_episode_steps"), py::arg("seeds"), py::arg("buffers"),
           py::arg("options"))
      .def("pin", &P::pin, py::arg("cores"))
      .def("send", &P::send, py::arg("ids"), py::arg("actions"))
      .def("wait", &P::wait, py::arg("min_count"))
      .def("reset", &P::reset, py::arg("ids"), py::arg("seeds"))
      .def("close", &P::close);
}

}  // namespace gmi_drl

// The module of env class `ENV`, named `NAME` (the extension's last name component in setup.py).
#define GMI_DRL_ENV_MODULE(NAME, ENV, DOC) \
  PYBIND11_MODULE(NAME, m) { gmi_drl::bind_env<ENV>(m, DOC); }
