// gmi_drl.envs._cartpole_pool: a complete CartPole-v1 pool (EnvPool's reset/send/recv/step API)
// in C++, stepped in the caller's thread.
//
// A CartPole step is ~20 ns of arithmetic; in Python the pool's bookkeeping around it (ids,
// validation, statistics, gathering a batch) costs microseconds per call, so here the whole pool
// is native, as in EnvPool (the EnvPool paper, §3: the C++ core does everything but
// the thin binding). The Python side (gmi_drl/envs/cartpole_native.py) keeps only each env's
// `np.random.Generator`: it pre-draws reset states in blocks, which the pool consumes in order,
// so trajectories equal Gymnasium's (gymnasium/envs/classic_control/cartpole.py, the same
// float64 operations in the same order; tests/envs/test_cartpole_native.py).
//
// Outputs are views of buffers this object owns, valid until its next reset/recv/step call.

#include "episodes.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <sstream>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

using gmi_drl::Episodes;
using gmi_drl::kDisabled;
using gmi_drl::kSameStep;

constexpr double kGravity = 9.8, kMassPole = 0.1, kTotalMass = 0.1 + 1.0;
constexpr double kLength = 0.5, kPoleMassLength = 0.1 * 0.5, kForceMag = 10.0, kTau = 0.02;
constexpr double kXThreshold = 2.4;
const double kThetaThreshold = 12 * 2 * M_PI / 360;

std::string ids_str(const std::vector<int64_t>& ids) {
  std::ostringstream s;
  s << "[";
  for (size_t k = 0; k < ids.size(); ++k) s << (k ? ", " : "") << ids[k];
  s << "]";
  return s.str();
}

template <typename T>
py::array_t<T> zeros(std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::fill(a.mutable_data(), a.mutable_data() + a.size(), T(0));
  return a;
}

py::array_t<int64_t> read_only_arange(py::ssize_t n) {
  auto a = zeros<int64_t>({n});
  for (py::ssize_t i = 0; i < n; ++i) a.mutable_data()[i] = i;
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// Per-env results, one row per env: the pool's state (num_envs rows, indexed by env id) or a
// recv batch (env_batch_size rows, in return order).
struct Rows {
  explicit Rows(py::ssize_t rows)
      : obs(zeros<float>({rows, 4})), final_obs(zeros<float>({rows, 4})),
        reward(zeros<double>({rows})), episode_return(zeros<double>({rows})),
        terminated(zeros<bool>({rows})), truncated(zeros<bool>({rows})),
        episode_end(zeros<bool>({rows})), episode_length(zeros<int64_t>({rows})) {}

  // Row `from` of this into row `to` of `out` (final_obs only where it is reported).
  void copy_row(int from, Rows& out, int to, bool with_final_obs) const {
    std::copy(obs.data() + 4 * from, obs.data() + 4 * from + 4, out.obs.mutable_data() + 4 * to);
    if (with_final_obs)
      std::copy(final_obs.data() + 4 * from, final_obs.data() + 4 * from + 4,
                out.final_obs.mutable_data() + 4 * to);
    out.reward.mutable_data()[to] = reward.data()[from];
    out.episode_return.mutable_data()[to] = episode_return.data()[from];
    out.terminated.mutable_data()[to] = terminated.data()[from];
    out.truncated.mutable_data()[to] = truncated.data()[from];
    out.episode_end.mutable_data()[to] = episode_end.data()[from];
    out.episode_length.mutable_data()[to] = episode_length.data()[from];
  }

  // EnvPool's (obs, rewards, terminated, truncated, info) of these rows.
  py::tuple result(const py::array& env_id, bool with_final_obs) const {
    py::dict info;
    info["env_id"] = env_id;
    info["episode_return"] = episode_return;
    info["episode_length"] = episode_length;
    info["episode_end"] = episode_end;
    if (with_final_obs) info["final_obs"] = final_obs;
    return py::make_tuple(obs, reward, terminated, truncated, info);
  }

  py::array_t<float> obs, final_obs;
  py::array_t<double> reward, episode_return;
  py::array_t<bool> terminated, truncated, episode_end;
  py::array_t<int64_t> episode_length;
};

class CartPolePool {
 public:
  // draw(env_id) -> (k, 4) float64: env_id's next k reset states from its generator.
  CartPolePool(int num_envs, int env_batch_size, int autoreset, int max_episode_steps,
               bool sutton_barto_reward, py::object draw, py::object episode_ended_error)
      : n_(num_envs), b_(env_batch_size), sutton_barto_(sutton_barto_reward), draw_(draw),
        ended_error_(episode_ended_error), episodes_(num_envs, autoreset, max_episode_steps),
        state_(4 * num_envs, 0.0), in_flight_(num_envs, false), draws_(num_envs),
        draw_pos_(num_envs, 0), slots_(num_envs), out_(env_batch_size),
        all_ids_(read_only_arange(num_envs)), out_ids_(read_only_arange(env_batch_size)) {}

  py::tuple reset(py::object env_id) {
    check_open();
    std::vector<int64_t> ids = env_id.is_none() ? all() : check_ids(env_id);
    std::vector<int64_t> busy;
    for (int64_t i : ids) if (in_flight_[i]) busy.push_back(i);
    if (!busy.empty())
      throw py::value_error("env_id " + ids_str(busy) + " has a step in flight; recv() its "
                            "result before resetting it");
    for (int64_t i : ids) start_episode(static_cast<int>(i));
    py::dict info;
    if (env_id.is_none()) {
      info["env_id"] = all_ids_;
      return py::make_tuple(slots_.obs, info);
    }
    py::array_t<int64_t> idarr(static_cast<py::ssize_t>(ids.size()));
    py::array_t<float> obs({static_cast<py::ssize_t>(ids.size()), py::ssize_t(4)});
    for (size_t k = 0; k < ids.size(); ++k) {
      idarr.mutable_data()[k] = ids[k];
      const float* row = slots_.obs.data() + 4 * ids[k];
      std::copy(row, row + 4, obs.mutable_data() + 4 * k);
    }
    info["env_id"] = idarr;
    return py::make_tuple(obs, info);
  }

  void send(py::object actions, py::object env_id) {
    check_open();
    ids_.clear();
    if (env_id.ptr() == out_ids_.ptr() && !recv_ids_sent_) {  // the ids of our last recv
      const int64_t* p = out_ids_.data();
      ids_.assign(p, p + b_);
      recv_ids_sent_ = true;
    } else {
      recv_ids_sent_ = true;  // (any other send may overlap the last recv's ids)
      ids_ = env_id.is_none() ? all() : check_ids(env_id);
      std::vector<int64_t> busy;
      if (num_in_flight_ > 0)
        for (int64_t i : ids_) if (in_flight_[i]) busy.push_back(i);
      if (!busy.empty())
        throw py::value_error("env_id " + ids_str(busy) + " already has a step in flight; "
                              "recv() its result before sending it another action");
    }
    if (episodes_.mode == kDisabled) {
      std::vector<int64_t> ended;
      for (int64_t i : ids_) if (episodes_.ended(static_cast<int>(i))) ended.push_back(i);
      if (!ended.empty()) {
        PyErr_SetString(ended_error_.ptr(),
                        ("env_id " + ids_str(ended) + ": episode ended and autoreset is "
                         "disabled; call reset(env_id=...) for them before stepping").c_str());
        throw py::error_already_set();
      }
    }
    const int64_t* a = check_actions(actions, ids_.size());
    for (size_t k = 0; k < ids_.size(); ++k) step_env(static_cast<int>(ids_[k]), a[k]);
    for (int64_t i : ids_) {
      in_flight_[i] = true;
      ready_.push_back(static_cast<int>(i));
    }
    num_in_flight_ += static_cast<int>(ids_.size());
  }

  py::tuple recv() {
    check_open();
    if (num_in_flight_ < b_)
      throw std::runtime_error("recv() needs " + std::to_string(b_) + " envs in flight or "
                               "finished, but only " + std::to_string(num_in_flight_) +
                               " are; send() actions for more envs first");
    num_in_flight_ -= b_;
    recv_ids_sent_ = false;
    const bool final_obs = episodes_.mode == kSameStep;
    if (b_ == n_) {  // synchronous: the state buffers themselves, in env id order
      for (int k = 0; k < b_; ++k) in_flight_[ready_[k]] = false;
      ready_.erase(ready_.begin(), ready_.begin() + b_);
      return slots_.result(all_ids_, final_obs);
    }
    // read-only to Python (sending it back skips re-validation), written here
    int64_t* ids = reinterpret_cast<int64_t*>(py::detail::array_proxy(out_ids_.ptr())->data);
    for (int k = 0; k < b_; ++k) {
      const int i = ready_.front();
      ready_.pop_front();
      in_flight_[i] = false;
      ids[k] = i;
      slots_.copy_row(i, out_, k, final_obs);
    }
    return out_.result(out_ids_, final_obs);
  }

  py::tuple step(py::object actions, py::object env_id) {
    if (!env_id.is_none()) {  // refused before anything is sent, as send's own checks
      const int n = static_cast<int>(py::len(env_id));
      if (num_in_flight_ + n < b_)
        throw py::value_error("step() of " + std::to_string(n) + " env(s) with " +
                              std::to_string(num_in_flight_) + " in flight cannot return a "
                              "batch of " + std::to_string(b_) + ": pass more env ids, or "
                              "use send() and recv()");
    }
    send(actions, env_id);
    return recv();
  }

  void close() { closed_ = true; }

  // Gymnasium's state of env i, [x, x_dot, theta, theta_dot] (for tests).
  py::array_t<double> get_state(int i) const {
    py::array_t<double> s(4);
    std::copy(&state_[4 * i], &state_[4 * i] + 4, s.mutable_data());
    return s;
  }

 private:
  void check_open() const {
    if (closed_) throw std::runtime_error("the CartPole-v1 pool is closed");
  }

  std::vector<int64_t> all() const {
    std::vector<int64_t> ids(n_);
    for (int i = 0; i < n_; ++i) ids[i] = i;
    return ids;
  }

  std::vector<int64_t> check_ids(py::object env_id) const {
    py::array a = py::module_::import("numpy").attr("asarray")(env_id);
    if (a.ndim() == 0) a = a.attr("reshape")(1);
    const char kind = a.dtype().kind();
    if (a.ndim() != 1 || (kind != 'i' && kind != 'u') || a.shape(0) == 0)
      throw py::value_error("env_id must be a non-empty 1-d array of ints, got " +
                            py::repr(env_id).cast<std::string>());
    auto v = a.attr("astype")("int64").cast<py::array_t<int64_t>>();
    std::vector<int64_t> ids(v.data(), v.data() + v.size());
    std::vector<char> seen(n_, 0);
    for (int64_t i : ids) {
      if (i < 0 || i >= n_)
        throw py::value_error("env_id " + ids_str(ids) + " out of range [0, " +
                              std::to_string(n_) + ")");
      if (seen[i]++) throw py::value_error("env_id " + ids_str(ids) + " repeats an id");
    }
    return ids;
  }

  // Discrete(2) actions: shape (n,), an integer dtype, values in {0, 1}.
  const int64_t* check_actions(py::object actions, size_t n) {
    py::array a = py::array::ensure(actions);
    if (!a) a = py::module_::import("numpy").attr("asarray")(actions);
    if (a.ndim() != 1 || static_cast<size_t>(a.shape(0)) != n) {
      std::string shape = py::str(a.attr("shape")).cast<std::string>();
      throw py::value_error("actions have shape " + shape + ", expected (" + std::to_string(n) +
                            ",) (one action of shape () per env_id)");
    }
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u')
      throw py::value_error("actions have dtype " + py::str(a.dtype()).cast<std::string>() +
                            ", expected an integer dtype for Discrete(2)");
    const int64_t* p;
    if (py::isinstance<py::array_t<int64_t>>(a) && (a.flags() & py::array::c_style)) {
      p = static_cast<const int64_t*>(a.data());
    } else {
      actions_ = a.attr("astype")("int64").cast<py::array_t<int64_t>>();
      p = actions_.data();
    }
    for (size_t k = 0; k < n; ++k)
      if (p[k] < 0 || p[k] > 1)
        throw py::value_error("actions outside the action space Discrete(2) (value " +
                              std::to_string(p[k]) + "); clip them to the space first");
    return p;
  }

  // The next pre-drawn reset state of env i (Gymnasium: np_random.uniform(-0.05, 0.05, (4,))).
  const double* next_reset(int i) {
    if (draw_pos_[i] * 4 >= draws_[i].size()) {
      auto block = draw_(i).cast<py::array_t<double, py::array::c_style | py::array::forcecast>>();
      draws_[i].assign(block.data(), block.data() + block.size());
      draw_pos_[i] = 0;
    }
    return &draws_[i][4 * draw_pos_[i]++];
  }

  void observe(int i, float* o) const {
    for (int j = 0; j < 4; ++j) o[j] = static_cast<float>(state_[4 * i + j]);
  }

  void start_episode(int i) {
    const double* s = next_reset(i);
    std::copy(s, s + 4, &state_[4 * i]);
    Rows& r = slots_;
    observe(i, r.obs.mutable_data() + 4 * i);
    r.reward.mutable_data()[i] = 0.0;
    r.terminated.mutable_data()[i] = r.truncated.mutable_data()[i] = false;
    r.episode_end.mutable_data()[i] = false;
    r.episode_return.mutable_data()[i] = 0.0;
    r.episode_length.mutable_data()[i] = 0;
    episodes_.start(i);
  }

  void step_env(int i, int64_t action) {
    if (episodes_.ended(i)) {  // next_step: this step only starts the new episode
      start_episode(i);
      return;
    }
    double* st = &state_[4 * i];
    double x = st[0], x_dot = st[1], theta = st[2], theta_dot = st[3];
    // cartpole.py, operation for operation
    const double force = action == 1 ? kForceMag : -kForceMag;
    const double costheta = std::cos(theta), sintheta = std::sin(theta);
    const double temp =
        (force + kPoleMassLength * (theta_dot * theta_dot) * sintheta) / kTotalMass;
    const double thetaacc =
        (kGravity * sintheta - costheta * temp) /
        (kLength * (4.0 / 3.0 - kMassPole * (costheta * costheta) / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
    x = x + kTau * x_dot;
    x_dot = x_dot + kTau * xacc;
    theta = theta + kTau * theta_dot;
    theta_dot = theta_dot + kTau * thetaacc;
    st[0] = x, st[1] = x_dot, st[2] = theta, st[3] = theta_dot;
    const bool terminated = x < -kXThreshold || x > kXThreshold || theta < -kThetaThreshold ||
                            theta > kThetaThreshold;
    const double reward = sutton_barto_ ? (terminated ? -1.0 : 0.0) : 1.0;
    const Episodes::Step e = episodes_.record(i, reward, terminated);
    Rows& r = slots_;
    float* o = r.obs.mutable_data() + 4 * i;
    observe(i, o);
    r.reward.mutable_data()[i] = reward;
    r.terminated.mutable_data()[i] = terminated;
    r.truncated.mutable_data()[i] = e.truncated;
    r.episode_end.mutable_data()[i] = e.done;
    r.episode_return.mutable_data()[i] = e.episode_return;
    r.episode_length.mutable_data()[i] = e.episode_length;
    if (e.done && episodes_.mode == kSameStep) {
      std::copy(o, o + 4, r.final_obs.mutable_data() + 4 * i);
      const double* s = next_reset(i);
      std::copy(s, s + 4, st);
      observe(i, o);
    }
  }

  const int n_, b_;
  const bool sutton_barto_;
  py::object draw_, ended_error_;
  Episodes episodes_;
  std::vector<double> state_;
  std::vector<char> in_flight_;
  std::vector<std::vector<double>> draws_;
  std::vector<size_t> draw_pos_;
  std::deque<int> ready_;
  std::vector<int64_t> ids_;
  py::array_t<int64_t> actions_;
  int num_in_flight_ = 0;
  bool recv_ids_sent_ = true, closed_ = false;
  Rows slots_, out_;
  py::array_t<int64_t> all_ids_, out_ids_;
};

}  // namespace

PYBIND11_MODULE(_cartpole_pool, mod) {
  mod.doc() = "CartPole-v1 pool in C++ (see gmi_drl/envs/cartpole_native.py)";
  py::class_<CartPolePool>(mod, "CartPolePool")
      .def(py::init<int, int, int, int, bool, py::object, py::object>(), py::arg("num_envs"),
           py::arg("env_batch_size"), py::arg("autoreset"), py::arg("max_episode_steps"),
           py::arg("sutton_barto_reward"), py::arg("draw"), py::arg("episode_ended_error"))
      .def("reset", &CartPolePool::reset, py::arg("env_id") = py::none())
      .def("send", &CartPolePool::send, py::arg("actions"), py::arg("env_id") = py::none())
      .def("recv", &CartPolePool::recv)
      .def("step", &CartPolePool::step, py::arg("actions"), py::arg("env_id") = py::none())
      .def("close", &CartPolePool::close)
      .def("get_state", &CartPolePool::get_state);
}
