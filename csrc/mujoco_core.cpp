// gmi_drl.envs._mujoco_core: Gymnasium v5 locomotion (Hopper, Walker2d, HalfCheetah, Swimmer,
// Ant, Humanoid) stepped asynchronously on a C++ thread pool, one MjData per env.
//
// EnvPool's design (the EnvPool paper, §3): `send` queues env ids with their
// actions and returns; worker threads each pop an env, apply the action, run `frame_skip`
// mj_step calls and write observation, reward, termination, time limit, episode statistics and
// autoreset straight into the pool's per-env state buffers (NumPy arrays owned by Python);
// `wait` blocks, without the GIL, until enough envs finished and returns their ids in
// completion order. The Python side (gmi_drl/envs/mujoco_threads.py) owns the envs' random
// generators: it pre-draws each env's next reset state into `next_qpos`/`next_qvel`, so no
// worker ever needs Python.
//
// Every formula follows gymnasium/envs/mujoco/{hopper,walker2d,half_cheetah,swimmer,ant,
// humanoid}_v5.py in the same floating-point order (see the comments at each; sums of squares as
// NumPy's pairwise sum); tests/envs/test_mujoco_threads.py steps it in lockstep with the
// Gymnasium envs.

#include "episodes.h"
#include "py_buffers.h"
#include "work_queue.h"

#include <mujoco/mujoco.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using gmi_drl::Episodes;

// np.sum(np.square(x)) of n contiguous values, in NumPy's order: its pairwise sum (fewer than 8
// values in sequence; up to 128 in 8 interleaved accumulators then the rest in sequence; longer
// halves split at a multiple of 8). Squares are >= 0, so NumPy's 0 or -0 start changes nothing.
template <typename T>
T pairwise_sum_squares(const T* a, long n) {
  if (n < 8) {
    T res = 0;
    for (long i = 0; i < n; ++i) res += a[i] * a[i];
    return res;
  }
  if (n <= 128) {
    T r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j] * a[j];
    long i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j] * a[i + j];
    T res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i] * a[i];
    return res;
  }
  long n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum_squares(a, n2) + pairwise_sum_squares(a + n2, n - n2);
}

enum Kind { kPlanar = 0, kAnt = 1, kHumanoid = 2 };

// The reward/termination parameters of one task; see the Python classes for their meaning.
struct Task {
  int kind = kPlanar;       // kPlanar (qpos/qvel only), kAnt, kHumanoid
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
  // Ant and Humanoid (contact forces from mj_rnePostConstraint, derived fields from mj_forward)
  double contact_w = 0.0;   // contact_cost_weight
  double force_low = 0.0, force_high = 0.0;  // Ant: contact_force_range (obs and cost)
  double cost_low = 0.0, cost_high = 0.0;    // Humanoid: contact_cost_range
  int main_body = 1;        // Ant: the body whose xpos gives the forward velocity
  double mass_total = 1.0;  // Humanoid: np.sum(body_mass), as NumPy sums it
  bool obs_cfrc = false;    // observation parts after [qpos[skip:], qvel], in Gymnasium's order
  bool obs_cinert = false, obs_cvel = false, obs_qfrc = false;
};

class MujocoCore {
 public:
  MujocoCore(py::object model, int num_envs, int num_threads, Task task, int autoreset,
             int max_episode_steps, py::dict buffers)
      : model_obj_(model), n_(num_envs), task_(task),
        episodes_(num_envs, autoreset, max_episode_steps) {
    m_ = reinterpret_cast<mjModel*>(model.attr("_address").cast<std::uintptr_t>());
    if (n_ < 1 || num_threads < 1) throw std::invalid_argument("num_envs and num_threads >= 1");
    nq_ = m_->nq;
    nv_ = m_->nv;
    nu_ = m_->nu;
    const int rows = m_->nbody - 1;
    obs_dim_ = nq_ - task_.obs_skip + nv_ + rows * (10 * task_.obs_cinert + 6 * task_.obs_cvel) +
               (nv_ - 6) * task_.obs_qfrc + rows * 6 * task_.obs_cfrc;
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
    scratch_.resize(n_);
    queue_ = std::make_unique<gmi_drl::WorkQueue>(num_threads, [this](int i) { return run(i); });
  }

  ~MujocoCore() { close(); }

  // Pin the worker threads (`gmi_drl::WorkQueue::pin`).
  void pin(const std::vector<int>& cores) const {
    if (!queue_) throw std::runtime_error("the core is closed");
    queue_->pin(cores);
  }

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
  // weight to float32 for a float32 action); Humanoid squares data.ctrl, float64.
  template <typename T>
  void take_actions(const int64_t* id, const py::array& actions) {
    auto a = actions.unchecked<T, 2>();
    std::vector<T> row(nu_);
    for (py::ssize_t k = 0; k < a.shape(0); ++k) {
      double* dst = &action_[id[k] * nu_];
      for (int j = 0; j < nu_; ++j) row[j] = dst[j] = a(k, j);
      ctrl_cost_[id[k]] = task_.kind == kHumanoid
          ? task_.ctrl_w * pairwise_sum_squares<double>(dst, nu_)
          : static_cast<T>(task_.ctrl_w) * pairwise_sum_squares<T>(row.data(), nu_);
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

  // mj_resetData, then the pre-drawn noisy qpos/qvel (Gymnasium's reset_model and set_state).
  // mj_forward runs for Ant and Humanoid, which read derived fields (xpos, cinert, ...); the
  // planar tasks read only qpos/qvel, and mj_step recomputes every derived field. cfrc_ext stays
  // as mj_resetData left it (zero): Gymnasium's reset runs no mj_rnePostConstraint.
  void load_next_state(int i) {
    mjData* d = data_[i];
    mj_resetData(m_, d);
    mju_copy(d->qpos, next_qpos_ + static_cast<size_t>(i) * nq_, nq_);
    mju_copy(d->qvel, next_qvel_ + static_cast<size_t>(i) * nv_, nv_);
    has_next_[i] = false;
    if (task_.kind != kPlanar) {
      mj_forward(m_, d);
      mju_zero(d->cfrc_ext, 6 * m_->nbody);
    }
  }

  void start_episode(int i) {
    mjData* d = data_[i];
    load_next_state(i);
    observe(d, obs_ + static_cast<size_t>(i) * obs_dim_);
    reward_[i] = 0.0;
    terminated_[i] = truncated_[i] = false;
    ep_return_[i] = 0.0;
    ep_length_[i] = 0;
    episodes_.start(i);
  }

  static double clip(double v, double lo, double hi) {  // np.clip: NaN stays NaN
    return v < lo ? lo : (v > hi ? hi : v);
  }

  // [qpos[obs_skip:], qvel clipped like np.clip], then Humanoid's cinert[1:], cvel[1:],
  // qfrc_actuator[6:], cfrc_ext[1:] or Ant's clip(cfrc_ext)[1:], each where enabled
  void observe(const mjData* d, double* o) const {
    const Task& t = task_;
    int k = 0;
    for (int j = t.obs_skip; j < nq_; ++j) o[k++] = d->qpos[j];
    for (int j = 0; j < nv_; ++j) o[k++] = t.vel_clip > 0 ? clip(d->qvel[j], -t.vel_clip,
                                                                  t.vel_clip) : d->qvel[j];
    const int nb = m_->nbody;
    if (t.obs_cinert) for (int j = 10; j < 10 * nb; ++j) o[k++] = d->cinert[j];
    if (t.obs_cvel) for (int j = 6; j < 6 * nb; ++j) o[k++] = d->cvel[j];
    if (t.obs_qfrc) for (int j = 6; j < nv_; ++j) o[k++] = d->qfrc_actuator[j];
    if (t.obs_cfrc) {
      for (int j = 6; j < 6 * nb; ++j)
        o[k++] = t.kind == kAnt ? clip(d->cfrc_ext[j], t.force_low, t.force_high)
                                : d->cfrc_ext[j];
    }
  }

  // The x coordinate whose change over a step is the forward velocity: Ant's main body xpos;
  // Humanoid's mass centre (np.sum(mass * xipos, axis=0) / np.sum(mass): in body order).
  double x_position(const mjData* d) const {
    if (task_.kind == kAnt) return d->xpos[3 * task_.main_body];
    if (task_.kind == kHumanoid) {
      double num = 0.0;
      for (int b = 0; b < m_->nbody; ++b) num += m_->body_mass[b] * d->xipos[3 * b];
      return num / task_.mass_total;
    }
    return d->qpos[0];
  }

  // Ant: contact_cost_weight * np.sum(np.square(clip(cfrc_ext))); Humanoid: np.clip(
  // contact_cost_weight * np.sum(np.square(cfrc_ext)), *contact_cost_range)
  double contact_cost(const mjData* d, std::vector<double>& scratch) const {
    const int n = 6 * m_->nbody;
    const Task& t = task_;
    if (t.kind == kAnt) {
      scratch.resize(n);
      for (int j = 0; j < n; ++j) scratch[j] = clip(d->cfrc_ext[j], t.force_low, t.force_high);
      return t.contact_w * pairwise_sum_squares<double>(scratch.data(), n);
    }
    return clip(t.contact_w * pairwise_sum_squares<double>(d->cfrc_ext, n), t.cost_low,
                t.cost_high);
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
    const double x_before = x_position(d);
    mju_copy(d->ctrl, &action_[static_cast<size_t>(i) * nu_], nu_);
    for (int s = 0; s < task_.frame_skip; ++s) mj_step(m_, d);
    if (task_.kind != kPlanar) mj_rnePostConstraint(m_, d);  // MujocoEnv.do_simulation
    const double x_velocity = (x_position(d) - x_before) / task_.dt;
    double* o = obs_ + static_cast<size_t>(i) * obs_dim_;
    observe(d, o);
    double reward;
    bool terminated = false;
    if (task_.kind == kAnt) {
      // healthy: state_vector() finite and min_z <= z <= max_z; rewards = x_velocity *
      // forward_w + healthy * healthy_reward; reward = rewards - (ctrl_cost + contact_cost)
      bool ok = task_.min_z <= d->qpos[2] && d->qpos[2] <= task_.max_z;
      for (int j = 0; j < nq_ && ok; ++j) ok = std::isfinite(d->qpos[j]);
      for (int j = 0; j < nv_ && ok; ++j) ok = std::isfinite(d->qvel[j]);
      const double rewards = x_velocity * task_.forward_w + (ok ? task_.healthy_reward : 0.0);
      reward = rewards - (ctrl_cost_[i] + contact_cost(d, scratch_[i]));
      terminated = !ok && task_.terminate;
    } else if (task_.kind == kHumanoid) {
      // healthy: min_z < z < max_z; rewards = forward_w * x_velocity + healthy * healthy_reward
      const bool ok = task_.min_z < d->qpos[2] && d->qpos[2] < task_.max_z;
      const double rewards = task_.forward_w * x_velocity + (ok ? task_.healthy_reward : 0.0);
      reward = rewards - (ctrl_cost_[i] + contact_cost(d, scratch_[i]));
      terminated = !ok && task_.terminate;
    } else if (task_.healthy_terms) {
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
      load_next_state(i);
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
  std::vector<std::vector<double>> scratch_;  // per env (threads step different envs)
  std::unique_ptr<gmi_drl::WorkQueue> queue_;  // last: its threads stop before the rest goes
};

}  // namespace

PYBIND11_MODULE(_mujoco_core, mod) {
  mod.doc() = "Planar MuJoCo locomotion tasks stepped on a C++ thread pool (see mujoco_threads.py)";
  mod.attr("MUJOCO_VERSION") = mjVERSION_HEADER;
  py::class_<Task>(mod, "Task")
      .def(py::init<>())
      .def_readwrite("kind", &Task::kind)
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
      .def_readwrite("dt", &Task::dt)
      .def_readwrite("contact_w", &Task::contact_w)
      .def_readwrite("force_low", &Task::force_low)
      .def_readwrite("force_high", &Task::force_high)
      .def_readwrite("cost_low", &Task::cost_low)
      .def_readwrite("cost_high", &Task::cost_high)
      .def_readwrite("main_body", &Task::main_body)
      .def_readwrite("mass_total", &Task::mass_total)
      .def_readwrite("obs_cfrc", &Task::obs_cfrc)
      .def_readwrite("obs_cinert", &Task::obs_cinert)
      .def_readwrite("obs_cvel", &Task::obs_cvel)
      .def_readwrite("obs_qfrc", &Task::obs_qfrc);
  mod.attr("KIND_PLANAR") = static_cast<int>(kPlanar);
  mod.attr("KIND_ANT") = static_cast<int>(kAnt);
  mod.attr("KIND_HUMANOID") = static_cast<int>(kHumanoid);
  py::class_<MujocoCore>(mod, "MujocoCore")
      .def(py::init<py::object, int, int, Task, int, int, py::dict>(), py::arg("model"),
           py::arg("num_envs"), py::arg("num_threads"), py::arg("task"), py::arg("autoreset"),
           py::arg("max_episode_steps"), py::arg("buffers"))
      .def("pin", [](const MujocoCore& self, const std::vector<int>& cores) { self.pin(cores); },
           py::arg("cores"))
      .def("send", &MujocoCore::send)
      .def("wait", &MujocoCore::wait)
      .def("reset", &MujocoCore::reset)
      .def("close", &MujocoCore::close);
}
