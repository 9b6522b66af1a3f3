// gmi_drl.envs._atari_core: Atari games on EnvPool's shared queue (work_queue.h), one emulator
// per env, stepped on C++ threads.
//
// The emulator and its preprocessing (frame skip, max-pooling, grayscale, INTER_AREA resize,
// frame stack, no-op starts, FIRE reset, life-loss flags) are ale-py's own
// `ale::vector::PreprocessedEnv`, the per-env class of ale-py's vector env, called through the
// symbols ale-py's extension module exports. This module is compiled against that class's header
// from the ale-py source distribution of exactly the installed version (setup.py fetches it at
// build time) and is not linked against ale-py. setup.py links it with `--wrap` for each ale-py
// symbol it calls, so every call lands in a `__wrap_` function below that forwards through a
// pointer `bind` looked up with dlsym in the already loaded `ale_py._ale_py`, opened RTLD_LOCAL:
// nothing of ale-py (which also exports zlib and SDL functions) enters the global symbol scope.
//
// Why not ale-py's own vector env: its `send` routes action k to the k-th env of its last
// `recv`, so it can neither step an arbitrary subset of envs nor return every env's first
// observation at reset, which EnvPool's API (`send(actions, env_id)`) needs. Here `send` takes
// env ids, as EnvPool's ActionBufferQueue does (the EnvPool paper, §3).
//
// Per env and step a worker thread runs exactly what ale-py's vector env runs for one env in
// NextStep mode (reset if the episode is over, else step; then `write_to`), writing straight
// into the pool's per-env buffers; the game bookkeeping on top stays in Python
// (gmi_drl/envs/atari.py). tests/envs/test_atari.py checks that both engines give identical
// trajectories.

#include "py_buffers.h"
#include "work_queue.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dlfcn.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ale/vector/preprocessed_env.hpp"

namespace py = pybind11;

#ifndef GMI_ALE_PY_VERSION
#error "GMI_ALE_PY_VERSION (the ale-py version whose header this is built against) is not set"
#endif

using ale::vector::OutputSlot;
using ale::vector::PreprocessedEnv;

// --- ale-py's symbols, bound at run time ------------------------------------------------------
// Each X(name, mangled symbol, return type, parameters) is one function of ale-py this module
// calls; its C++ call sites are redirected to __wrap_<symbol> by the linker (setup.py reads the
// symbols from this list and passes one --wrap each).
// Parameters follow the Itanium C++ ABI: `this` first, references as pointers.
#define GMI_ALE_SYMBOLS(X)                                                                     \
  X(ctor, _ZN3ale6vector15PreprocessedEnvC1EiRKNSt10filesystem7__cxx114pathEiiibbiibbbbifbi,   \
    void, (void* self, int env_id, const std::filesystem::path* rom, int h, int w, int skip,     \
           bool maxpool, bool gray, int stack, int noop_max, bool fire, bool episodic,           \
           bool life_info, bool clip, int max_steps, float sticky, bool full, int seed),         \
    (self, env_id, rom, h, w, skip, maxpool, gray, stack, noop_max, fire, episodic, life_info,   \
     clip, max_steps, sticky, full, seed))                                                      \
  X(interface_dtor, _ZN3ale12ALEInterfaceD1Ev, void, (void* self), (self))                     \
  X(set_seed, _ZN3ale6vector15PreprocessedEnv8set_seedEi, void, (void* self, int seed),         \
    (self, seed))                                                                              \
  X(set_action, _ZN3ale6vector15PreprocessedEnv10set_actionEif, void,                          \
    (void* self, int action, float strength), (self, action, strength))                        \
  X(reset, _ZN3ale6vector15PreprocessedEnv5resetEv, void, (void* self), (self))                \
  X(step, _ZN3ale6vector15PreprocessedEnv4stepEv, void, (void* self), (self))                  \
  X(is_episode_over, _ZNK3ale6vector15PreprocessedEnv15is_episode_overEv, bool,                \
    (const void* self), (self))                                                                \
  X(write_to, _ZNK3ale6vector15PreprocessedEnv8write_toERKNS0_10OutputSlotE, void,            \
    (const void* self, const OutputSlot* slot), (self, slot))

namespace {

struct AleFunctions {
#define GMI_ALE_POINTER(name, symbol, ret, params, args) ret(*name) params = nullptr;
  GMI_ALE_SYMBOLS(GMI_ALE_POINTER)
#undef GMI_ALE_POINTER
};
AleFunctions ale_fn;
bool ale_bound = false;

// Look up every ale-py function in the loaded library at `path` (RTLD_NOLOAD: it must be loaded
// already, by `import ale_py`). Raises RuntimeError naming a missing symbol.
void bind(const std::string& path) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) throw std::runtime_error("ale-py's module is not loaded: " + path);
  AleFunctions f;
#define GMI_ALE_LOOKUP(name, symbol, ret, params, args)                                        \
  f.name = reinterpret_cast<ret(*) params>(dlsym(lib, #symbol));                               \
  if (f.name == nullptr) throw std::runtime_error("ale-py exports no " #symbol);
  GMI_ALE_SYMBOLS(GMI_ALE_LOOKUP)
#undef GMI_ALE_LOOKUP
  ale_fn = f;
  ale_bound = true;  // the handle stays open: ale-py's module lives as long as the process
}

}  // namespace

extern "C" {
#define GMI_ALE_WRAPPER(name, symbol, ret, params, args) \
  __attribute__((visibility("hidden"))) ret __wrap_##symbol params { return ale_fn.name args; }
GMI_ALE_SYMBOLS(GMI_ALE_WRAPPER)
#undef GMI_ALE_WRAPPER
}

namespace {

template <typename T>
T opt(const py::dict& options, const char* name) {
  if (!options.contains(name)) throw std::invalid_argument(std::string("missing option ") + name);
  return options[name].cast<T>();
}

class AtariCore {
 public:
  // `options`: PreprocessedEnv's settings by name (max_episode_steps in frames). `buffers`:
  // obs (num_envs, obs_bytes) uint8, reward/lives/frame (num_envs,) int32 (frame: the episode
  // frame number), terminated/truncated (num_envs,) bool; kept alive by this object.
  AtariCore(const std::string& rom, int num_envs, int num_threads, const py::dict& options,
            const py::dict& buffers)
      : n_(num_envs), buffers_(buffers) {
    if (!ale_bound) throw std::runtime_error("bind() ale-py's module first");
    if (num_envs < 1 || num_threads < 1)
      throw std::invalid_argument("num_envs and num_threads must be >= 1");
    envs_.reserve(n_);
    for (int i = 0; i < n_; ++i) {
      envs_.push_back(std::make_unique<PreprocessedEnv>(
          i, rom, opt<int>(options, "img_height"), opt<int>(options, "img_width"),
          opt<int>(options, "frame_skip"), opt<bool>(options, "maxpool"),
          opt<bool>(options, "grayscale"), opt<int>(options, "stack_num"),
          opt<int>(options, "noop_max"), opt<bool>(options, "use_fire_reset"),
          opt<bool>(options, "episodic_life"), opt<bool>(options, "life_loss_info"),
          opt<bool>(options, "reward_clipping"), opt<int>(options, "max_episode_steps"),
          opt<float>(options, "repeat_action_probability"),
          opt<bool>(options, "full_action_space"), -1));
    }
    num_actions_ = static_cast<int>(envs_[0]->action_set().size());
    obs_bytes_ = static_cast<py::ssize_t>(envs_[0]->stacked_obs_size());
    obs_ = gmi_drl::buffer<uint8_t>(buffers, "obs", n_, obs_bytes_);
    reward_ = gmi_drl::buffer<int32_t>(buffers, "reward", n_, 1);
    terminated_ = gmi_drl::buffer<bool>(buffers, "terminated", n_, 1);
    truncated_ = gmi_drl::buffer<bool>(buffers, "truncated", n_, 1);
    lives_ = gmi_drl::buffer<int32_t>(buffers, "lives", n_, 1);
    frame_ = gmi_drl::buffer<int32_t>(buffers, "frame", n_, 1);
    queue_ = std::make_unique<gmi_drl::WorkQueue>(std::min(num_threads, n_),
                                                  [this](int i) { return run(i); });
  }

  ~AtariCore() { close(); }

  // Pin the worker threads (`gmi_drl::WorkQueue::pin`).
  void pin(const std::vector<int>& cores) const {
    if (!queue_) throw std::runtime_error("the core is closed");
    queue_->pin(cores);
  }

  void close() {
    if (!queue_) return;
    queue_->stop();
    queue_.reset();
    envs_.clear();
  }

  // The ALE action codes of the action indices, in order.
  std::vector<int> action_set() const {
    std::vector<int> out;
    for (auto a : envs_.at(0)->action_set()) out.push_back(static_cast<int>(a));
    return out;
  }

  py::ssize_t obs_bytes() const { return obs_bytes_; }

  // Queue one step of each env in `ids` (none in flight) with action index `actions[k]`;
  // returns at once. An env whose episode is over is reset instead (its action is ignored).
  void send(py::array_t<int64_t, py::array::c_style> ids,
            py::array_t<int64_t, py::array::c_style> actions) {
    const py::ssize_t n = check(ids, actions);
    const int64_t* id = ids.data();
    const int64_t* act = actions.data();
    for (py::ssize_t k = 0; k < n; ++k) envs_[id[k]]->set_action(static_cast<int>(act[k]), 1.0f);
    queue_->push(id, static_cast<size_t>(n));
  }

  // Block (GIL released) until >= min_count queued envs finished; their ids in completion order.
  py::array_t<int64_t> wait(int min_count) {
    return gmi_drl::wait_ids(queue_.get(), min_count);
  }


  // Run `ids` (none in flight) one after another in the calling thread (GIL released) and write
  // their results: with `reset`, a new game each, reseeded with `seeds[k]` where >= 0 (the ROM
  // reloads with ALE random_seed = seed); else one step each with `actions[k]`, as `send`.
  void run_now(py::array_t<int64_t, py::array::c_style> ids,
               py::array_t<int64_t, py::array::c_style> actions,
               py::array_t<int64_t, py::array::c_style> seeds, bool reset) {
    const py::ssize_t n = check(ids, actions);
    if (seeds.ndim() != 1 || seeds.shape(0) != n)
      throw std::invalid_argument("seeds must have shape (len(ids),)");
    const int64_t *id = ids.data(), *act = actions.data(), *seed = seeds.data();
    std::string error;
    if (!queue_->enter()) throw std::runtime_error("the Atari core is closed");
    {
      py::gil_scoped_release release;
      for (py::ssize_t k = 0; k < n && error.empty(); ++k) {
        PreprocessedEnv& env = *envs_[id[k]];
        try {
          if (reset) {
            env.set_seed(static_cast<int>(seed[k]));
            env.reset();
            write(static_cast<int>(id[k]));
          } else {
            env.set_action(static_cast<int>(act[k]), 1.0f);
            error = run(static_cast<int>(id[k]));
          }
        } catch (const std::exception& e) {
          error = e.what();
        }
        if (!error.empty()) error = "env_id " + std::to_string(id[k]) + ": " + error;
      }
      queue_->leave();
    }
    if (!error.empty()) throw std::runtime_error(error);
  }

 private:
  py::ssize_t check(const py::array_t<int64_t, py::array::c_style>& ids,
                    const py::array_t<int64_t, py::array::c_style>& actions) const {
    if (!queue_) throw std::runtime_error("the Atari core is closed");
    const py::ssize_t n = ids.shape(0);
    if (ids.ndim() != 1 || actions.ndim() != 1 || actions.shape(0) != n)
      throw std::invalid_argument("ids and actions must have shape (n,)");
    for (py::ssize_t k = 0; k < n; ++k) {
      if (ids.data()[k] < 0 || ids.data()[k] >= n_) throw std::invalid_argument("env id out of range");
      if (actions.data()[k] < 0 || actions.data()[k] >= num_actions_)
        throw std::invalid_argument("action index out of range");
    }
    return n;
  }

  // ale-py's NextStep step of one env (a queue job): reset if the episode is over, else step.
  std::string run(int i) {
    PreprocessedEnv& env = *envs_[i];
    try {
      if (env.is_episode_over()) env.reset(); else env.step();
      write(i);
    } catch (const std::exception& e) {
      return std::string("ALE step failed: ") + e.what();
    }
    return "";
  }

  void write(int i) {
    int env_id, frame_number;  // not reported
    const OutputSlot slot{obs_ + static_cast<size_t>(i) * obs_bytes_, &env_id, &reward_[i],
                          &terminated_[i], &truncated_[i], &lives_[i], &frame_number,
                          &frame_[i], nullptr};
    envs_[i]->write_to(slot);
  }

  int n_;
  int num_actions_ = 0;
  py::ssize_t obs_bytes_ = 0;
  py::dict buffers_;  // keeps the buffers alive
  uint8_t* obs_ = nullptr;
  int32_t *reward_ = nullptr, *lives_ = nullptr, *frame_ = nullptr;
  bool *terminated_ = nullptr, *truncated_ = nullptr;
  std::vector<std::unique_ptr<PreprocessedEnv>> envs_;
  std::unique_ptr<gmi_drl::WorkQueue> queue_;  // last: its threads stop before the envs go
};

}  // namespace

PYBIND11_MODULE(_atari_core, mod) {
  mod.doc() = "Atari games on a C++ thread pool over ale-py's emulators (see atari_native.py)";
  mod.attr("ALE_PY_VERSION") = GMI_ALE_PY_VERSION;
  std::vector<std::string> symbols;
#define GMI_ALE_NAME(name, symbol, ret, params, args) symbols.push_back(#symbol);
  GMI_ALE_SYMBOLS(GMI_ALE_NAME)
#undef GMI_ALE_NAME
  mod.attr("ALE_SYMBOLS") = symbols;
  mod.def("bind", &bind, py::arg("path"),
          "Bind the ale-py functions this module calls to the loaded module at `path`.");
  py::class_<AtariCore>(mod, "AtariCore")
      .def(py::init<const std::string&, int, int, const py::dict&, const py::dict&>(),
           py::arg("rom"), py::arg("num_envs"), py::arg("num_threads"), py::arg("options"),
           py::arg("buffers"))
      .def("action_set", &AtariCore::action_set)
      .def("obs_bytes", &AtariCore::obs_bytes)
      .def("pin", [](const AtariCore& self, const std::vector<int>& cores) { self.pin(cores); },
           py::arg("cores"))
      .def("send", &AtariCore::send)
      .def("wait", &AtariCore::wait)
      .def("run_now", &AtariCore::run_now)
      .def("close", &AtariCore::close);
}
