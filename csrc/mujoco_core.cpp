// gmi_drl.envs._mujoco_core: Gymnasium v5 planar locomotion (Hopper, Walker2d, HalfCheetah)
// stepped asynchronously on a C++ thread pool, one MjData per env.
//
// EnvPool's design (papers/003_e9bf2f468e812145.txt, §3): `send` queues env ids with their
// actions and returns; worker threads each pop an env, apply the action, run `frame_skip`
// mj_step calls and write observation, reward, termination, time limit, episode statistics and
// autoreset straight into the pool's per-env state buffers (NumPy arrays owned by Python);
// `wait` blocks, without the GIL, until enough envs finished and returns their ids in
// completion order. The Python side (gmi_drl/envs/mujoco_threads.py) owns the envs' random
// generators: it pre-draws each env's next reset state into `next_qpos`/`next_qvel`, so no
// worker ever needs Python.
//
// Every formula follows gymnasium/envs/mujoco/{hopper,walker2d,half_cheetah}_v5.py in the same
// floating-point order (see the comments at each); tests/envs/test_mujoco_threads.py steps it in
// lockstep with the Gymnasium envs.

#include "episodes.h"
#include "py_buffers.h"
#include "work_queue.h"

#include <mujoco/mujoco.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using gmi_drl::Episodes;

// The reward/termination parameters of one task; see the Python classes for their meaning.
struct Task {
  int frame_skip = 1;
  int obs_skip = 1;         // leading qpos entries left out of the observation
  double vel_clip = 0.0;    // > 0: qvel clipped to [-vel_clip, vel_clip] in the observation
  double forward_w = 1.0;   // forward_reward_weight
  double ctrl_w = 0.0;      // ctrl_cost_weight
  bool healthy_terms = false;  // Hopper/Walker2d: healthy reward and termination
  double healthy_reward = 0.0;
  bool terminate = false;   // terminate_when_unhealthy
  bool state_range = false; // Hopper: every qpos[2:], qvel inside (min_state, max_state)
  double min_state = 0, max_state = 0, min_z = 0, max_z = 0, min_angle = 0, max_angle = 0;
  double dt = 0.0;          // seconds per env step: timestep * frame_skip
};

class MujocoCore {
 public:
  MujocoCore(py::object model, int num_envs, int num_threads, Task task, int autoreset,
             int max_episode_steps, py::dict buffers)
      : model_obj_(model), n_(num_envs), task_(task),
        episodes_(num_envs, autoreset, max_episode_steps) {
    m_ = reinterpret_cast<mjModel*>(model.attr("_address").cast<std::uintptr_t>());
    if (n_ < 1 || num_threads < 1) throw std::invalid_argument("num_envs and num_threads >= 1");
    if (m_->nu >= 8) throw std::invalid_argument("at most 7 actuators");  // see ctrl_cost()
    nq_ = m_->nq;
    nv_ = m_->nv;
    nu_ = m_->nu;
    obs_dim_ = nq_ - task_.obs_skip + nv_;
    bufs_ = buffers;
    obs_ = gmi_drl::buffer<double>(buffers, "obs", n_, obs_dim_);
    final_obs_ = gmi_drl::buffer<double>(buffers, "final_obs", n_, obs_dim_);
    reward_ = gmi_drl::buffer<double>(buffers, "reward", n_, 1);
    terminated_ = gmi_drl::buffer<bool>(buffers, "terminated", n_, 1);
    truncated_ = gmi_drl::buffer<bool>(buffers, "truncated", n_, 1);
    ep_return_ = gmi_drl::buffer<double>(buffers, "episode_return", n_, 1);
    ep_length_ = gmi_drl::buffer<int64_t>(buffers, "episode_length", n_, 1);
    next_qpos_ = gmi_drl::buffer<double>(buffers, "next_qpos", n_, nq_);
    next_qvel_ = gmi_drl::buffer<double>(buffers, "next_qvel", n_, nv_);
    has_next_ = gmi_drl::buffer<bool>(buffers, "has_next", n_, 1);
    data_.resize(n_, nullptr);
    for (int i = 0; i < n_; ++i) {
      data_[i] = mj_makeData(m_);
      if (!data_[i]) throw std::runtime_error("mj_makeData failed (out of memory?)");
    }
    action_.assign(static_cast<size_t>(n_) * nu_, 0.0);
    ctrl_cost_.assign(n_, 0.0);
    queue_ = std::make_unique<gmi_drl::WorkQueue>(num_threads, [this](int i) { return run(i); });
  }

  ~MujocoCore() { close(); }

  void close() {
    if (!queue_) return;
    queue_->stop();
    queue_.reset();
    for (auto* d : data_) mj_deleteData(d);
    data_.clear();
  }

  // Queue `ids` with `actions (n, nu)` float32 or float64; returns at once.
  void send(py::array_t<int64_t, py::array::c_style> ids, py::array actions) {
    const py::ssize_t n = ids.shape(0);
    const int64_t* id = ids.data();
    if (actions.ndim() != 2 || actions.shape(0) != n || actions.shape(1) != nu_)
      throw std::invalid_argument("actions must have shape (len(ids), nu)");
    for (py::ssize_t k = 0; k < n; ++k)
      if (id[k] < 0 || id[k] >= n_) throw std::invalid_argument("env id out of range");
    if (py::isinstance<py::array_t<float>>(actions)) {
      take_actions<float>(id, actions);
    } else if (py::isinstance<py::array_t<double>>(actions)) {
      take_actions<double>(id, actions);
    } else {
      throw std::invalid_argument("actions must be float32 or float64");
    }
    if (!queue_) throw std::runtime_error("the core is closed");
    queue_->push(id, static_cast<size_t>(n));
  }

  // Block (GIL released) until >= min_count queued envs finished; return all finished ids in
  // completion order. Raises RuntimeError naming the env whose simulation failed.
  py::array_t<int64_t> wait(int min_count) {
    return gmi_drl::wait_ids(queue_.get(), min_count);
  }


  // Reset `ids` (none in flight) in the calling thread from their pre-drawn next_qpos/qvel.
  void reset(py::array_t<int64_t, py::array::c_style> ids) {
    const int64_t* id = ids.data();
    for (py::ssize_t k = 0; k < ids.shape(0); ++k) {
      if (id[k] < 0 || id[k] >= n_) throw std::invalid_argument("env id out of range");
      if (!has_next_[id[k]]) throw std::runtime_error("reset without a pre-drawn state");
    }
    for (py::ssize_t k = 0; k < ids.shape(0); ++k) start_episode(static_cast<int>(id[k]));
  }

 private:
  // Store each env's action as its controls and its control cost. Gymnasium: ctrl_cost_weight *
  // np.sum(np.square(action)) is computed in the action's dtype (NumPy 2 casts the Python float
  // weight to float32 for a float32 action); np.sum of fewer than 8 values adds them in order.
  template <typename T>
  void take_actions(const int64_t* id, const py::array& actions) {
    auto a = actions.unchecked<T, 2>();
    for (py::ssize_t k = 0; k < a.shape(0); ++k) {
      T sum = 0;
      double* dst = &action_[id[k] * nu_];
      for (int j = 0; j < nu_; ++j) {
        const T v = a(k, j);
        sum += v * v;
        dst[j] = v;
      }
      ctrl_cost_[id[k]] = static_cast<T>(task_.ctrl_w) * sum;
    }
  }

  // Step env i (on a queue thread); the error message, empty on success.
  std::string run(int i) {
    try {
      step(i);
    } catch (const std::exception& e) {
      return std::string("MuJoCo step failed: ") + e.what();
    }
    return "";
  }

  // mj_resetData, then the pre-drawn noisy qpos/qvel (Gymnasium's reset_model); outputs of a
  // fresh episode. mj_forward is not run: it changes no state and mj_step recomputes every
  // derived field (the planar tasks read only qpos/qvel).
  void start_episode(int i) {
    mjData* d = data_[i];
    mj_resetData(m_, d);
    mju_copy(d->qpos, next_qpos_ + static_cast<size_t>(i) * nq_, nq_);
    mju_copy(d->qvel, next_qvel_ + static_cast<size_t>(i) * nv_, nv_);
    has_next_[i] = false;
    observe(d, obs_ + static_cast<size_t>(i) * obs_dim_);
    reward_[i] = 0.0;
    terminated_[i] = truncated_[i] = false;
    ep_return_[i] = 0.0;
    ep_length_[i] = 0;
    episodes_.start(i);
  }

  // [qpos[obs_skip:], qvel clipped like np.clip (NaN stays NaN)]
  void observe(const mjData* d, double* o) const {
    int k = 0;
    for (int j = task_.obs_skip; j < nq_; ++j) o[k++] = d->qpos[j];
    const double c = task_.vel_clip;
    for (int j = 0; j < nv_; ++j) {
      double v = d->qvel[j];
      if (c > 0) v = v < -c ? -c : (v > c ? c : v);
      o[k++] = v;
    }
  }

  bool healthy(const mjData* d) const {
    const Task& t = task_;
    if (t.state_range) {  // hopper_v5: state_vector()[2:] = qpos[2:], qvel
      for (int j = 2; j < nq_; ++j)
        if (!(t.min_state < d->qpos[j] && d->qpos[j] < t.max_state)) return false;
      for (int j = 0; j < nv_; ++j)
        if (!(t.min_state < d->qvel[j] && d->qvel[j] < t.max_state)) return false;
    }
    const double z = d->qpos[1], angle = d->qpos[2];
    return t.min_z < z && z < t.max_z && t.min_angle < angle && angle < t.max_angle;
  }

  void step(int i) {
    if (episodes_.ended(i)) {  // next_step autoreset: this step only starts the new episode
      if (!has_next_[i]) throw std::runtime_error("no pre-drawn reset state");
      start_episode(i);
      return;
    }
    mjData* d = data_[i];
    const double x_before = d->qpos[0];
    mju_copy(d->ctrl, &action_[static_cast<size_t>(i) * nu_], nu_);
    for (int s = 0; s < task_.frame_skip; ++s) mj_step(m_, d);
    const double x_velocity = (d->qpos[0] - x_before) / task_.dt;
    double* o = obs_ + static_cast<size_t>(i) * obs_dim_;
    observe(d, o);
    double reward;
    bool terminated = false;
    if (task_.healthy_terms) {
      // rewards = forward_reward + healthy_reward; reward = rewards - ctrl_cost
      const bool ok = healthy(d);
      reward = task_.forward_w * x_velocity + (ok ? task_.healthy_reward : 0.0);
      reward = reward - ctrl_cost_[i];
      terminated = !ok && task_.terminate;
    } else {
      reward = task_.forward_w * x_velocity - ctrl_cost_[i];  // half_cheetah_v5
    }
    const Episodes::Step e = episodes_.record(i, reward, terminated);
    reward_[i] = reward;
    terminated_[i] = terminated;
    truncated_[i] = e.truncated;
    ep_return_[i] = e.episode_return;
    ep_length_[i] = e.episode_length;
    if (e.done && episodes_.mode == gmi_drl::kSameStep) {
      if (!has_next_[i]) throw std::runtime_error("no pre-drawn reset state");
      double* f = final_obs_ + static_cast<size_t>(i) * obs_dim_;
      std::copy(o, o + obs_dim_, f);
      mj_resetData(m_, d);
      mju_copy(d->qpos, next_qpos_ + static_cast<size_t>(i) * nq_, nq_);
      mju_copy(d->qvel, next_qvel_ + static_cast<size_t>(i) * nv_, nv_);
      has_next_[i] = false;
      observe(d, o);
    }
  }

  py::object model_obj_;  // keeps the MjModel alive
  py::dict bufs_;         // keeps the state buffers alive
  mjModel* m_ = nullptr;
  int n_, nq_ = 0, nv_ = 0, nu_ = 0, obs_dim_ = 0;
  Task task_;
  Episodes episodes_;
  double *obs_, *final_obs_, *reward_, *ep_return_, *next_qpos_, *next_qvel_;
  bool *terminated_, *truncated_, *has_next_;
  int64_t* ep_length_;
  std::vector<mjData*> data_;
  std::vector<double> action_, ctrl_cost_;
  std::unique_ptr<gmi_drl::WorkQueue> queue_;  // last: its threads stop before the rest goes
};

}  // namespace

PYBIND11_MODULE(_mujoco_core, mod) {
  mod.doc() = "Planar MuJoCo locomotion tasks stepped on a C++ thread pool (see mujoco_threads.py)";
  mod.attr("MUJOCO_VERSION") = mjVERSION_HEADER;
  py::class_<Task>(mod, "Task")
      .def(py::init<>())
      .def_readwrite("frame_skip", &Task::frame_skip)
      .def_readwrite("obs_skip", &Task::obs_skip)
      .def_readwrite("vel_clip", &Task::vel_clip)
      .def_readwrite("forward_w", &Task::forward_w)
      .def_readwrite("ctrl_w", &Task::ctrl_w)
      .def_readwrite("healthy_terms", &Task::healthy_terms)
      .def_readwrite("healthy_reward", &Task::healthy_reward)
      .def_readwrite("terminate", &Task::terminate)
      .def_readwrite("state_range", &Task::state_range)
      .def_readwrite("min_state", &Task::min_state)
      .def_readwrite("max_state", &Task::max_state)
      .def_readwrite("min_z", &Task::min_z)
      .def_readwrite("max_z", &Task::max_z)
      .def_readwrite("min_angle", &Task::min_angle)
      .def_readwrite("max_angle", &Task::max_angle)
      .def_readwrite("dt", &Task::dt);
  py::class_<MujocoCore>(mod, "MujocoCore")
      .def(py::init<py::object, int, int, Task, int, int, py::dict>(), py::arg("model"),
           py::arg("num_envs"), py::arg("num_threads"), py::arg("task"), py::arg("autoreset"),
           py::arg("max_episode_steps"), py::arg("buffers"))
      .def("send", &MujocoCore::send)
      .def("wait", &MujocoCore::wait)
      .def("reset", &MujocoCore::reset)
      .def("close", &MujocoCore::close);
}
