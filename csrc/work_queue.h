// EnvPool's asynchronous engine (the EnvPool paper, §3), shared by the native
// cores that step envs on threads (_mujoco_core, _atari_core): `push` queues env ids and
// returns; worker threads pop one id each and run the core's job for it (which writes that env's
// results into the pool's buffers); `wait` blocks until enough envs finished and returns their ids
// in completion order.

#pragma once

#include <pthread.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gmi_drl {

class WorkQueue {
 public:
  // Runs one env (never two calls for the same id at once); returns an error message, or ""
  // on success. Called on worker threads and, in `wait`, on the waiting thread.
  using Job = std::function<std::string(int)>;

  WorkQueue(int num_threads, Job job) : job_(std::move(job)) {
    try {
      for (int t = 0; t < num_threads; ++t) workers_.emplace_back([this] { work(); });
    } catch (...) {  // e.g. a thread limit: join those started, then raise
      stop();
      throw;
    }
  }

  ~WorkQueue() { stop(); }

  // Pin worker thread t to CPU cores[t % cores.size()] (EnvPool's thread affinity); the thread
  // that waits is the caller's and keeps its own. Throws std::runtime_error naming the core the
  // kernel refused.
  void pin(const std::vector<int>& cores) {
    if (cores.empty()) return;
    for (std::size_t t = 0; t < workers_.size(); ++t) {
      const int core = cores[t % cores.size()];
      if (core < 0 || core >= CPU_SETSIZE)
        throw std::runtime_error("core " + std::to_string(core) + " is out of range");
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(core, &set);
      const int err = pthread_setaffinity_np(workers_[t].native_handle(), sizeof(set), &set);
      if (err != 0)
        throw std::runtime_error("pinning a worker thread to core " + std::to_string(core) +
                                 " failed: " + std::strerror(err));
    }
  }

  int num_workers() const { return static_cast<int>(workers_.size()); }

  // Joins every worker (an env being run finishes first), makes a `wait` in another thread
  // return with an error, and returns once no call between `enter` and `leave` is left, so the
  // caller may then free what the jobs use. Idempotent.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      stopping_.store(true, std::memory_order_relaxed);
    }
    work_cv_.notify_all();
    done_cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return active_ == 0; });
  }

  // Bracket a call that uses the envs from the caller's thread (`wait`, or running envs
  // directly): `stop` waits for its `leave`. Call `enter` before releasing the GIL (as `stop`
  // holds it), so a `stop` either comes first (enter returns false) or waits for this call.
  bool enter() {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    ++active_;
    return true;
  }

  void leave() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    idle_cv_.notify_all();
  }

  void push(const int64_t* ids, std::size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (std::size_t k = 0; k < n; ++k) queue_.push_back(static_cast<int>(ids[k]));
      in_flight_ += static_cast<int>(n);
      queued_.store(static_cast<int>(queue_.size()), std::memory_order_relaxed);
    }
    if (n == 1) work_cv_.notify_one(); else work_cv_.notify_all();
  }

  // Block until >= min_count pushed envs finished (fewer if fewer are in flight) and return all
  // finished ids in completion order. Call without the GIL. On failure returns false with the
  // first error, "env_id <i>: <message>", in `error`.
  bool wait(int min_count, std::vector<int64_t>* out, std::string* error) {
    std::unique_lock<std::mutex> lock(mu_);
    if (waiting_) {  // want_ is one; a second waiter would starve the first
      *error = "wait() is already running in another thread: a pool is for one thread at a time";
      return false;
    }
    const int available = in_flight_ + static_cast<int>(done_.size());
    if (min_count > available) min_count = available;
    if (min_count < 1 && done_.empty()) {
      *error = "wait() with nothing in flight";
      return false;
    }
    want_ = min_count;
    waiting_ = true;
    // The waiting thread runs queued envs itself rather than sleep (EnvPool's caller sleeps):
    // the caller is one of the pool's threads (`queue_workers` in Python starts one worker
    // fewer), so no more threads are runnable than the pool has, and a batch costs no wake-up
    // (faster than a sleeping caller on 2 cores: docs/benchmarks.md).
    while (static_cast<int>(done_.size()) < want_ && error_.empty() && !stop_) {
      if (queue_.empty()) {
        if (in_flight_ <= 1) {  // one env left, on a worker: spin on the free core
          lock.unlock();
          spin([&] { return num_done_.load(std::memory_order_relaxed) >= want_ ||
                            stopping_.load(std::memory_order_relaxed); });
          lock.lock();
        }
        done_cv_.wait(lock, [&] {
          return static_cast<int>(done_.size()) >= want_ || !error_.empty() ||
                 !queue_.empty() || stop_;
        });
        continue;
      }
      const int i = pop();
      lock.unlock();
      std::string err = run(i);
      lock.lock();
      finish(i, err);
    }
    want_ = 1 << 30;
    waiting_ = false;
    if (!error_.empty()) {
      *error = error_;
      return false;
    }
    if (stop_ && static_cast<int>(done_.size()) < min_count) {
      *error = "the pool was closed while waiting";
      return false;
    }
    out->assign(done_.begin(), done_.end());
    done_.clear();
    num_done_.store(0, std::memory_order_relaxed);
    return true;
  }

 private:
  // Busy-wait up to kSpin for `ready` before a caller blocks on a condition variable: a thread
  // that finished its env often gets the next one within microseconds (the caller's Python
  // between recv and send), and a futex sleep and wake-up costs tens of microseconds on a
  // virtual machine. EnvPool's semaphores spin the same way before they block.
  template <typename Ready>
  static void spin(Ready ready) {
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (int k = 1; !ready(); ++k) {
      if ((k & 63) == 0 && std::chrono::steady_clock::now() >= until) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }

  int pop() {  // mu_ held, queue_ not empty
    const int i = queue_.front();
    queue_.pop_front();
    queued_.store(static_cast<int>(queue_.size()), std::memory_order_relaxed);
    return i;
  }

  void work() {
    for (;;) {
      int i;
      spin([&] { return queued_.load(std::memory_order_relaxed) > 0 ||
                        stopping_.load(std::memory_order_relaxed); });
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        i = pop();
      }
      std::string error = run(i);
      bool wake;
      {
        std::lock_guard<std::mutex> lock(mu_);
        wake = finish(i, error);
      }
      if (wake) done_cv_.notify_one();
    }
  }

  std::string run(int i) {
    try {
      return job_(i);
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown C++ exception";
    }
  }

  // Record env i as done (mu_ held); whether the waiting thread should wake.
  bool finish(int i, const std::string& error) {
    --in_flight_;
    if (!error.empty() && error_.empty()) error_ = "env_id " + std::to_string(i) + ": " + error;
    done_.push_back(i);
    num_done_.store(static_cast<int>(done_.size()), std::memory_order_relaxed);
    return static_cast<int>(done_.size()) >= want_ || !error_.empty();
  }

  static constexpr std::chrono::microseconds kSpin{50};

  Job job_;
  // Mirrors of queue_.size(), done_.size() and stop_ that spinning threads read without mu_.
  std::atomic<int> queued_{0}, num_done_{0};
  std::atomic<bool> stopping_{false};
  std::condition_variable idle_cv_;
  int active_ = 0;        // calls between enter and leave
  bool waiting_ = false;  // a wait is running
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<int> queue_;
  std::vector<int64_t> done_;
  int in_flight_ = 0;
  int want_ = 1 << 30;
  bool stop_ = false;
  std::string error_;
};

// `queue->wait` for a pybind11 method: the GIL released while blocked, the ids as an int64 array,
// a failure (or a closed core: `queue` null) raised as RuntimeError.
inline pybind11::array_t<int64_t> wait_ids(WorkQueue* queue, int min_count) {
  if (queue == nullptr || !queue->enter()) throw std::runtime_error("the core is closed");
  std::vector<int64_t> out;
  std::string error;
  bool ok;
  {
    pybind11::gil_scoped_release release;
    ok = queue->wait(min_count, &out, &error);
    queue->leave();  // `queue` may be freed from here on
  }
  if (!ok) throw std::runtime_error(error);
  pybind11::array_t<int64_t> ids(static_cast<pybind11::ssize_t>(out.size()));
  std::copy(out.begin(), out.end(), ids.mutable_data());
  return ids;
}

}  // namespace gmi_drl
