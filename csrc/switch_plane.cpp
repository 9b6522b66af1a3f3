// The iSwitch daemon's native data plane (iSwitch §3.3): `gmi_drl.comm.switch._plane.NativePlane`.
//
// The same state machine as the Python reference `gmi_drl.comm.switch.dataplane.PyDataPlane`
// (read that first: this file follows it line by line), run over batches of datagrams:
// `recvmmsg` takes up to 64 messages per system call, each data packet's payload is copied into
// its member's row of the slot pool, a completed slot is summed in ascending member id with
// vectorised adds, and the results queued during a batch leave together. Control packets, and
// the addresses of strangers that sent data, go back to Python, which runs the control plane.
// Threshold mode (Async iSwitch, `PyDataPlane.set_threshold_mode`): per segment offset, the
// gradients of any workers until H of them, summed in (member id, arrival) order, kept for Help.
//
// The kernel's per-datagram cost, not this code, dominates at Ethernet MTUs, so the plane uses
// UDP generic segmentation both ways (Linux >= 5.0; plain datagrams where refused): with UDP_GRO
// on the socket one received message may hold several datagrams of one sender (split here by the
// segment size the kernel reports), and the queued results for one destination leave as one
// UDP_SEGMENT send of up to 64 KB that the kernel (or the NIC) cuts into the same datagrams
// on the wire. Nothing of the protocol changes. Every packet format constant comes from `protocol.native_layout()`;
// nothing here spells a byte offset of its own.

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int kBatch = 64;    // messages per recvmmsg call
constexpr int kTx = 512;      // data packets queued before they must go out
constexpr int kCmsg = 64;     // control-message bytes per received message (IP_TOS, UDP_GRO)
constexpr int kGsoBytes = 65507;  // the most UDP payload one GSO send may carry
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
enum State : uint8_t { FREE = 0, FILLING = 1, UP = 2, DONE = 3 };

// The data plane's counters: `gmi_drl.comm.switch.dataplane.COUNTERS`, in that order (checked
// when a plane is made).
enum Counter {
  PACKETS_IN, PACKETS_OUT, BYTES_AGGREGATED, SEGMENTS_COMPLETED, DUPLICATES,
  RETRANSMISSIONS_SERVED, MALFORMED_DROPPED, NON_MEMBER_DROPPED, NOT_READY_DROPPED,
  STALE_DROPPED, BUSY_DROPPED, INJECTED_DROPS, STALENESS_DROPPED, AGGREGATES_COMPLETED,
  NUM_COUNTERS
};
constexpr const char* kCounterNames[NUM_COUNTERS] = {
    "packets_in", "packets_out", "bytes_aggregated", "segments_completed", "duplicates",
    "retransmissions_served", "malformed_dropped", "non_member_dropped", "not_ready_dropped",
    "stale_dropped", "busy_dropped", "injected_drops", "staleness_dropped",
    "aggregates_completed"};
constexpr uint32_t kKept = 64;       // threshold mode: results kept per offset (KEPT_AGGREGATES)
constexpr uint32_t kTagMod = 1u << 15;  // threshold mode: tags mod this (ASYNC_TAG_MOD)
constexpr uint32_t kFlush = 0xFFFFFFFFu;  // FBCAST Value: flush every open aggregate

double monotonic() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock of Python's time.monotonic()
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t addr_key(const sockaddr_in& a) {
  return (uint64_t(ntohl(a.sin_addr.s_addr)) << 16) | ntohs(a.sin_port);
}

// The IP_TOS byte and the UDP_GRO segment size of a received message (left as they are where
// the message has none).
void read_cmsgs(msghdr& h, int& tos, int& gso) {
  for (cmsghdr* cm = CMSG_FIRSTHDR(&h); cm != nullptr; cm = CMSG_NXTHDR(&h, cm)) {
    if (cm->cmsg_level == IPPROTO_IP && cm->cmsg_type == IP_TOS) tos = *CMSG_DATA(cm);
    if (cm->cmsg_level == IPPROTO_UDP && cm->cmsg_type == UDP_GRO) {
      std::memcpy(&gso, CMSG_DATA(cm), sizeof gso);
    }
  }
}

sockaddr_in make_addr(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    throw std::invalid_argument("not an IPv4 address: " + ip);
  }
  return a;
}

py::tuple py_addr(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return py::make_tuple(std::string(ip), int(ntohs(a.sin_port)));
}

constexpr size_t kSegCmsg = CMSG_SPACE(sizeof(uint16_t));

// Make `h` a UDP_SEGMENT send of `seg_bytes`-byte datagrams; `space` holds kSegCmsg bytes.
void set_udp_segment(msghdr& h, uint8_t* space, size_t seg_bytes) {
  h.msg_control = space;
  h.msg_controllen = kSegCmsg;
  cmsghdr* cm = CMSG_FIRSTHDR(&h);
  cm->cmsg_level = IPPROTO_UDP;
  cm->cmsg_type = UDP_SEGMENT;
  cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  uint16_t seg = uint16_t(seg_bytes);
  std::memcpy(CMSG_DATA(cm), &seg, sizeof seg);
}

// Serial-number order (RFC 1982) on 32-bit seq, as protocol.seq_newer.
bool seq_newer(uint32_t a, uint32_t b) {
  uint32_t d = a - b;
  return d != 0 && d < (1u << 31);
}

// One field of the Seg header: where it is and how many big-endian bytes it spans.
struct Field {
  int offset = 0, size = 0;
  uint32_t read(const uint8_t* p) const {
    uint32_t v = 0;
    for (int i = 0; i < size; ++i) v = (v << 8) | p[offset + i];
    return v;
  }
  void write(uint8_t* p, uint32_t v) const {
    for (int i = size - 1; i >= 0; --i, v >>= 8) p[offset + i] = uint8_t(v);
  }
};

struct Layout {
  int header_bytes, float_bytes, tos_data, tos_control, rx_bytes, action_stats, max_count;
  uint32_t flag_result, flag_fbcast, flag_async, known_flags;
  Field seq, round, member, count, flags;

  explicit Layout(const py::dict& d) {
    auto i = [&](const char* k) {
      if (!d.contains(k)) throw std::invalid_argument(std::string("layout lacks ") + k);
      return d[k].cast<int>();
    };
    auto f = [&](const char* name) {
      Field x{i((std::string(name) + "_offset").c_str()), i((std::string(name) + "_size").c_str())};
      if (x.size < 1 || x.size > 4) throw std::invalid_argument("header field wider than 4 bytes");
      return x;
    };
    header_bytes = i("header_bytes");
    float_bytes = i("float_bytes");
    tos_data = i("tos_data");
    tos_control = i("tos_control");
    rx_bytes = i("rx_buffer_bytes");
    action_stats = i("action_stats");
    max_count = i("max_count");
    flag_result = i("flag_result");
    flag_fbcast = i("flag_fbcast");
    flag_async = i("flag_async");
    known_flags = i("known_flags");
    seq = f("seq");
    round = f("round");
    member = f("member");
    count = f("count");
    flags = f("flags");
    if (float_bytes != 4) throw std::invalid_argument("the native plane sums float32 only");
  }
};

struct Slot {
  uint32_t seq = 0;
  State state = FREE;
  uint32_t length = 0;
  uint8_t round = 0;
  std::vector<uint8_t> has;                        // has[row]: row contributed
  std::vector<std::pair<int, int>> contrib;        // (member id, row)
  uint32_t count = 0, result_count = 0;
  double helped = 0;
};

// Threshold mode: one segment offset's open aggregate and kept results (`dataplane._Offset`).
struct Contribution {
  int member;
  uint64_t arrival;
  std::vector<float> data;
  bool operator<(const Contribution& o) const {
    return member != o.member ? member < o.member : arrival < o.arrival;
  }
};

struct Offset {
  uint32_t number = 0, length = 0, count = 0;  // count: gradients in the open aggregate
  uint32_t units = 0;  // contributions in it: a gradient, or a switch's partial
  std::vector<Contribution> contrib;
  std::unordered_map<int, uint32_t> last_push;  // worker id -> its newest push tag taken
  std::unordered_map<uint64_t, bool> taken;     // (switch key, batch) taken, the last 1024
  std::deque<uint64_t> taken_order;
  std::map<uint32_t, std::pair<std::vector<float>, uint32_t>> kept;
};

// Threshold mode at a child switch (`dataplane._Batch`): gradients of one region, summed per
// offset into one partial each, with the oldest one's version.
struct Part {
  int key;
  uint32_t push, count;
  std::vector<float> data;
  bool operator<(const Part& o) const { return key != o.key ? key < o.key : push < o.push; }
};

struct Batch {
  uint32_t number = 0, key = 0;
  int64_t oldest = 0;  // its gradients' oldest version (absolute)
  std::unordered_map<uint64_t, std::pair<int64_t, uint32_t>> versions;  // gradient -> (v, count)
  bool sealed = false;  // its gradients fixed (`seal`)
  int grads = 0;
  uint32_t count = 0;
  bool closed = false, gone = false;
  std::map<uint32_t, std::vector<Part>> parts;  // offset -> its segments
  std::map<uint32_t, uint32_t> length;           // offset -> floats
  std::set<uint32_t> sent;                       // offsets whose partial went up
  std::map<uint32_t, std::vector<float>> totals;  // offset -> the partial sent (queued sends
                                                  // read it until the next flush)
  double opened = 0, last = 0;
};

bool tag_newer(uint32_t a, uint32_t b) {
  uint32_t d = (a - b) % kTagMod;
  return d != 0 && d < (kTagMod >> 1);
}

struct Member {
  bool active = false;
  int id = 0, type = 0, workers_below = 0;
  sockaddr_in addr{};
};

struct Delayed {
  double due;
  sockaddr_in addr;
  bool control;
  std::vector<uint8_t> bytes;
};

class NativePlane {
 public:
  NativePlane(int fd, const py::dict& layout, int seg_floats, int slots, int max_members,
              int switch_id, int member_id, py::object parent, double drop_rate, double dup_rate,
              double delay_ms, double help_after_s, py::object seed,
              const std::vector<std::string>& counters)
      : fd_(fd), L_(layout), seg_(seg_floats), max_members_(max_members),
        switch_id_(switch_id), member_id_(member_id), drop_(drop_rate), dup_(dup_rate),
        delay_s_(delay_ms / 1000.0), help_after_(help_after_s) {
    if (slots < 2 || (slots & (slots - 1))) throw std::invalid_argument("slots: power of two");
    if (counters.size() != NUM_COUNTERS ||
        !std::equal(counters.begin(), counters.end(), kCounterNames)) {
      throw std::invalid_argument("dataplane.COUNTERS changed: update csrc/switch_plane.cpp");
    }
    if (max_members < 1 || max_members > 255) throw std::invalid_argument("max_members 1..255");
    if (seg_floats < 1) throw std::invalid_argument("seg_floats >= 1");
    mask_ = uint32_t(slots - 1);
    if (!parent.is_none()) {
      auto t = parent.cast<std::pair<std::string, int>>();
      parent_ = make_addr(t.first, t.second);
      has_parent_ = true;
    }
    if (seed.is_none()) {
      rng_.seed(std::random_device{}());
    } else {
      rng_.seed(seed.cast<uint64_t>());
    }
    size_t f = size_t(seg_floats);
    rows_.assign(size_t(slots) * max_members * f, 0.0f);
    partial_.assign(size_t(slots) * f, 0.0f);
    if (has_parent_) result_.assign(size_t(slots) * f, 0.0f);
    slots_.resize(slots);
    for (auto& s : slots_) {
      s.has.assign(max_members, 0);
      s.contrib.reserve(max_members);
    }
    members_.resize(max_members);
    last_seen_.assign(max_members, 0.0);
    pending_refs_.assign(slots, 0);
    active_.in.assign(slots, 0);
    rx_.assign(size_t(kBatch) * L_.rx_bytes, 0);
    rx_cmsg_.assign(size_t(kBatch) * kCmsg, 0);
    rx_from_.resize(kBatch);
    rx_iov_.resize(kBatch);
    rx_msgs_.resize(kBatch);
    tx_hdr_.assign(size_t(kTx) * L_.header_bytes, 0);
    tx_iov_.resize(2 * kTx);
    tx_to_.resize(kTx);
    tx_msgs_.resize(kTx);
    tx_slot_.resize(kTx);
    full_bytes_ = size_t(L_.header_bytes) + size_t(seg_floats) * 4;
    gso_max_ = int(std::min<size_t>(64, kGsoBytes / full_bytes_));
    int one = 1;
    gro_ = setsockopt(fd_, IPPROTO_UDP, UDP_GRO, &one, sizeof one) == 0;
    gso_ = gso_max_ >= 2;
    gso_iov_.resize(2 * kTx);
    gso_cmsg_.assign(size_t(kTx) * kSegCmsg, 0);
    for (int i = 0; i < kBatch; ++i) {
      rx_iov_[i] = {&rx_[size_t(i) * L_.rx_bytes], size_t(L_.rx_bytes)};
    }
  }

  // ---- the member table and group state, written by the control plane ------------------------

  void set_member(int row, int id, int type, const std::string& ip, int port, int workers_below) {
    check_row(row);
    Member& m = members_[row];
    if (m.active) addr_row_.erase(addr_key(m.addr));
    m = Member{true, id, type, workers_below, make_addr(ip, port)};
    addr_row_[addr_key(m.addr)] = row;
    set_units();
  }

  void remove_member(int row) {
    check_row(row);
    Member& m = members_[row];
    if (m.active) addr_row_.erase(addr_key(m.addr));
    m.active = false;
    set_units();
  }

  // Threshold mode: the contributions that complete an aggregate (`PyDataPlane._set_units`).
  void set_units() {
    int64_t h = thr_on_ ? thr_h_ : 1, n = 0, below = 0;
    for (const Member& x : members_) {
      if (!x.active) continue;
      ++n;
      below += std::max(1, x.workers_below);
    }
    int64_t u = (h * n + std::max<int64_t>(1, below) - 1) / std::max<int64_t>(1, below);
    units_ = uint32_t(std::max<int64_t>(1, std::min(h, u)));
  }

  // `ready`: the group is complete; `threshold`: H in members (0 = no members). Slots that
  // already hold H contributions complete now (H was lowered).
  void set_state(bool ready, int threshold) {
    ready_ = ready;
    threshold_ = threshold;
    if (threshold_ >= 1) {
      for (int idx : active_list()) {
        Slot& s = slots_[idx];
        if (s.state == FILLING && int(s.contrib.size()) >= threshold_) complete(idx, monotonic());
      }
    }
    flush();
  }

  // Threshold mode (`PyDataPlane.set_threshold_mode`): H gradients per aggregate from any
  // workers, staleness bound S; threshold 0 ends it.
  void set_threshold_mode(int threshold, int staleness) {
    if (threshold == 0) {
      flush();  // queued sends may still read kept results
      thr_on_ = false;
      offsets_.clear();
      fresh_.clear();
      fresh_order_.clear();
      clear_batches();
      return;
    }
    thr_on_ = true;
    thr_h_ = uint32_t(threshold);
    thr_s_ = uint32_t(staleness);
    set_units();
    for (auto& [o, a] : offsets_) {
      if (a.units >= units_) complete_offset(o, a);
    }
    flush();
  }

  py::object threshold_mode() const {
    if (!thr_on_) return py::none();
    return py::make_tuple(thr_h_, thr_s_);
  }

  double last_seen(int row) const {
    check_row(row);
    return last_seen_[row];
  }

  // ---- the data path -------------------------------------------------------------------------

  // Read what the socket holds now (at most `max_packets`, never blocking) and handle every
  // data packet. Returns (controls, strangers): [(bytes, (ip, port))] of control packets, in
  // arrival order and as often as fault injection duplicated them, and the addresses of
  // non-members that sent data (the control plane answers them NOT_MEMBER).
  py::tuple drain(int max_packets) {
    py::list controls, strangers;
    int handled = 0;
    while (handled < max_packets) {
      int want = std::min(kBatch, max_packets - handled);
      for (int i = 0; i < want; ++i) {
        msghdr& h = rx_msgs_[i].msg_hdr;
        h = msghdr{};
        h.msg_name = &rx_from_[i];
        h.msg_namelen = sizeof(sockaddr_in);
        h.msg_iov = &rx_iov_[i];
        h.msg_iovlen = 1;
        h.msg_control = &rx_cmsg_[size_t(i) * kCmsg];
        h.msg_controllen = kCmsg;
        rx_msgs_[i].msg_len = 0;
      }
      int n = recvmmsg(fd_, rx_msgs_.data(), unsigned(want), MSG_DONTWAIT, nullptr);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        ++handled;  // an ICMP error queued on the socket (port unreachable): read on
        continue;
      }
      if (n == 0) break;
      double now = monotonic();
      for (int i = 0; i < n; ++i) on_packet(i, now, controls, strangers);
      handled += n;
      flush();
      if (n < want) break;
    }
    flush();
    return py::make_tuple(controls, strangers);
  }

  // Control-plane requests that touch slots (the Python plane has the same methods).
  void reset_slots() {
    flush();
    for (auto& s : slots_) clear(s);
    active_.clear();
    offsets_.clear();
    fresh_.clear();
    fresh_order_.clear();
    clear_batches();
  }

  void fbcast(uint32_t seq) {
    if (thr_on_) {  // `PyDataPlane.fbcast`: one offset's open aggregate, or every one
      if (has_parent_) {  // a child's batches go up (the daemon passes the FBcast up)
        flush_batches(seq != kFlush);
      } else if (seq == kFlush) {
        for (auto& [o, a] : offsets_) {
          if (!a.contrib.empty()) complete_offset(o, a);
        }
      } else {
        auto it = offsets_.find(seq & 0xFFFFu);
        if (it != offsets_.end() && it->second.number % kTagMod == (seq >> 16) % kTagMod) {
          complete_offset(it->first, it->second);
        }
      }
      flush();
      return;
    }
    uint32_t idx = seq & mask_;
    Slot& s = slots_[idx];
    if (s.seq == seq && s.state == FILLING && !s.contrib.empty()) complete(idx, monotonic());
    flush();
  }

  // A member's Help: resend the kept result (counted as served) or the partial sent up.
  // False where a threshold-mode result is not kept here (a child switch asks its parent).
  bool help_from_member(uint32_t seq, const std::string& ip, int port) {
    if (thr_on_) {  // a threshold-mode result lost: resend the kept one
      bool served = false;
      auto it = offsets_.find(seq & 0xFFFFu);
      if (it != offsets_.end()) {
        Offset& a = it->second;
        uint32_t number = a.number - ((a.number - (seq >> 16)) % kTagMod);
        if (a.kept.count(number)) {
          send_kept(it->first, a, number, make_addr(ip, port),
                    L_.flag_result | L_.flag_async | L_.flag_fbcast);
          ++c_[RETRANSMISSIONS_SERVED];
          served = true;
        }
      }
      flush();
      return served;
    }
    uint32_t idx = seq & mask_;
    Slot& s = slots_[idx];
    if (s.seq == seq && s.state == DONE) {
      send_result(idx, make_addr(ip, port), L_.flag_result | L_.flag_fbcast);
      ++c_[RETRANSMISSIONS_SERVED];
    } else if (s.seq == seq && s.state == UP) {
      send_up(idx);
    }
    flush();
    return true;
  }

  // Threshold mode: (offset, aggregates completed) of every offset, ascending (a root's).
  py::list async_numbers() const {
    py::list out;
    for (const auto& [o, a] : offsets_) out.append(py::make_tuple(o, a.number));
    return out;
  }

  // The parent's Help: resend the partial, or (slot still filling) return the rows that have
  // contributed so that the control plane asks the others; None otherwise.
  py::object help_from_parent(uint32_t seq) {
    uint32_t idx = seq & mask_;
    Slot& s = slots_[idx];
    py::object out = py::none();
    if (s.seq == seq && (s.state == UP || s.state == DONE)) {
      send_up(idx);
    } else if (s.seq == seq && s.state == FILLING) {
      s.helped = monotonic();
      out = contributed(s);
    }
    flush();
    return out;
  }

  // Per slot waiting longer than help_after_s: resend a partial that went up, or list
  // (seq, contributed rows) of a filling slot for the control plane to send Help.
  py::list tick(double now) {
    py::list help;
    if (!batches_.empty()) tick_batches(now);
    for (int idx : active_list()) {
      Slot& s = slots_[idx];
      if (now - s.helped < help_after_) continue;
      s.helped = now;
      if (s.state == FILLING) {
        help.append(py::make_tuple(s.seq, contributed(s)));
      } else if (s.state == UP) {
        send_up(idx);
      }
    }
    flush();
    return help;
  }

  // A control message, with the receive-side faults: dropped with drop_rate and delayed by
  // delay_ms when `faults` (the control plane passes False for STATS_REPLY).
  void send_control(const std::string& ip, int port, py::bytes raw, bool faults) {
    if (faults && drop_ > 0 && uniform() < drop_) {
      ++c_[INJECTED_DROPS];
      return;
    }
    ++c_[PACKETS_OUT];
    std::string b = raw;
    sockaddr_in to = make_addr(ip, port);
    if (faults && delay_s_ > 0) {
      delayed_.push_back({monotonic() + delay_s_, to, true,
                          std::vector<uint8_t>(b.begin(), b.end())});
      return;
    }
    flush();
    send_one(to, reinterpret_cast<const uint8_t*>(b.data()), b.size(), true);
  }

  double next_due() const {
    return delayed_.empty() ? std::numeric_limits<double>::infinity() : delayed_.front().due;
  }

  void flush_delayed(double now) {
    while (!delayed_.empty() && delayed_.front().due <= now) {
      const Delayed& d = delayed_.front();
      send_one(d.addr, d.bytes.data(), d.bytes.size(), d.control);
      delayed_.pop_front();
    }
  }

  // `dataplane.COUNTERS` now, in its order.
  py::dict counters() const {
    py::dict d;
    for (int i = 0; i < NUM_COUNTERS; ++i) d[kCounterNames[i]] = c_[i];
    return d;
  }

 private:
  void check_row(int row) const {
    if (row < 0 || row >= max_members_) throw std::out_of_range("member row out of range");
  }

  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

  std::vector<int> active_list() const { return std::vector<int>(active_.begin(), active_.end()); }

  static void clear(Slot& s) {
    s.state = FREE;
    std::fill(s.has.begin(), s.has.end(), 0);
    s.contrib.clear();
    s.count = 0;
  }

  py::tuple contributed(const Slot& s) const {
    py::tuple t(s.contrib.size());
    for (size_t i = 0; i < s.contrib.size(); ++i) t[i] = s.contrib[i].second;
    return t;
  }

  float* row_ptr(uint32_t idx, int row) {
    return &rows_[(size_t(idx) * max_members_ + row) * seg_];
  }
  float* partial_ptr(uint32_t idx) { return &partial_[size_t(idx) * seg_]; }
  float* result_ptr(uint32_t idx) {
    return has_parent_ ? &result_[size_t(idx) * seg_] : partial_ptr(idx);
  }

  // One received message: a datagram, or with UDP_GRO several of one sender, `gso` bytes each
  // (the last may be shorter).
  void on_packet(int i, double now, py::list& controls, py::list& strangers) {
    const uint8_t* buf = &rx_[size_t(i) * L_.rx_bytes];
    size_t nbytes = rx_msgs_[i].msg_len;
    int tos = 0, gso = 0;
    read_cmsgs(rx_msgs_[i].msg_hdr, tos, gso);
    if (gso <= 0 || size_t(gso) >= nbytes) {
      on_datagram(buf, nbytes, tos, rx_from_[i], now, controls, strangers);
      return;
    }
    for (size_t off = 0; off < nbytes; off += size_t(gso)) {
      on_datagram(buf + off, std::min(size_t(gso), nbytes - off), tos, rx_from_[i], now,
                  controls, strangers);
    }
  }

  void on_datagram(const uint8_t* buf, size_t nbytes, int tos, const sockaddr_in& from,
                   double now, py::list& controls, py::list& strangers) {
    ++c_[PACKETS_IN];
    bool is_stats = tos == L_.tos_control && nbytes == 1 && buf[0] == L_.action_stats;
    if (drop_ > 0 && uniform() < drop_ && !is_stats) {
      ++c_[INJECTED_DROPS];
      return;
    }
    int times = (dup_ > 0 && uniform() < dup_) ? 2 : 1;
    for (int t = 0; t < times; ++t) {
      if (tos == L_.tos_data) {
        on_data(buf, nbytes, from, now, strangers);
      } else if (tos == L_.tos_control) {
        controls.append(py::make_tuple(py::bytes(reinterpret_cast<const char*>(buf), nbytes),
                                       py_addr(from)));
      } else {
        ++c_[MALFORMED_DROPPED];
      }
    }
  }

  void on_data(const uint8_t* buf, size_t nbytes, const sockaddr_in& from, double now,
               py::list& strangers) {
    auto it = addr_row_.find(addr_key(from));
    bool is_parent = has_parent_ && addr_key(from) == addr_key(parent_);
    if (it == addr_row_.end() && !is_parent) {
      ++c_[NON_MEMBER_DROPPED];
      strangers.append(py_addr(from));
      return;
    }
    // decode_data: a whole number k >= 1 of float32 after the header, k <= seg_floats,
    // count >= 1, no unknown flag
    if (nbytes < size_t(L_.header_bytes) + 4 || (nbytes - L_.header_bytes) % 4) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    uint32_t k = uint32_t((nbytes - L_.header_bytes) / 4);
    uint32_t seq = L_.seq.read(buf), rnd = L_.round.read(buf), mid = L_.member.read(buf);
    uint32_t count = L_.count.read(buf), flags = L_.flags.read(buf);
    if (k > uint32_t(seg_) || count == 0 || (flags & ~L_.known_flags)) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    const float* payload = reinterpret_cast<const float*>(buf + L_.header_bytes);
    if (is_parent) {
      if (!(flags & L_.flag_result)) {
        ++c_[MALFORMED_DROPPED];
        return;
      }
      if (flags & L_.flag_async) {  // (before this switch's own workers asked for the mode)
        on_parent_async(seq, count, k, payload);
        return;
      }
      on_result(seq, count, k, payload);
      return;
    }
    int row = it->second;
    const Member& m = members_[row];
    last_seen_[row] = now;
    if (flags & L_.flag_async) {
      on_async(m, seq, rnd, mid, count, flags, k, payload);
      return;
    }
    int below = std::max(1, m.workers_below);
    if ((flags & L_.flag_result) || int(mid) != m.id || int(count) > below ||
        (m.type == 0 && count != 1)) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    if (!ready_) {
      ++c_[NOT_READY_DROPPED];
      return;
    }
    uint32_t idx = seq & mask_;
    Slot& s = slots_[idx];
    if (s.state == FREE || s.seq != seq) {
      if (s.state == FREE || (s.state == DONE && seq_newer(seq, s.seq))) {
        if (pending_refs_[idx]) flush();  // queued sends still read this slot's result
        clear(s);
        s.seq = seq;
        s.state = FILLING;
        s.length = k;
        s.round = uint8_t(rnd);
        s.helped = now;
        active_.insert(idx);
      } else if (seq_newer(seq, s.seq)) {
        ++c_[BUSY_DROPPED];
        return;
      } else {
        ++c_[STALE_DROPPED];
        return;
      }
    }
    if (k != s.length) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    if (s.state == DONE) {
      if (s.has[row]) ++c_[DUPLICATES];
      send_result(idx, m.addr, L_.flag_result | L_.flag_fbcast);
      ++c_[RETRANSMISSIONS_SERVED];
      return;
    }
    if (s.has[row]) {
      ++c_[DUPLICATES];
      if (s.state == UP && now - s.helped > help_after_ / 4) {
        s.helped = now;
        send_up(idx);
      }
      return;
    }
    std::memcpy(row_ptr(idx, row), payload, size_t(k) * 4);
    c_[BYTES_AGGREGATED] += uint64_t(k) * 4;
    s.has[row] = 1;
    s.contrib.emplace_back(m.id, row);
    s.count += count;
    if (s.state == FILLING && int(s.contrib.size()) >= threshold_) complete(idx, now);
  }

  // A threshold-mode gradient segment: a worker's own (count 1), or a member switch's partial
  // of `count` gradients; a child switch adds it to a batch, the root to its offset's open
  // aggregate (`PyDataPlane._on_async`).
  void on_async(const Member& m, uint32_t seq, uint32_t rnd, uint32_t mid, uint32_t count,
                uint32_t flags, uint32_t k, const float* payload) {
    if (!thr_on_ || (flags & L_.flag_result) || int(mid) != m.id || (m.type == 0 && count != 1)) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    if (!ready_) {
      ++c_[NOT_READY_DROPPED];
      return;
    }
    int skey = m.type == 0 ? int(mid) : 256 + int(mid);  // (ids of either kind)
    uint32_t push = (seq >> 16) % kTagMod, o = seq & 0xFFFFu;
    if (has_parent_) {
      batch_segment(skey, push, o, rnd, count, k, payload);
      return;
    }
    Offset& a = offsets_[o];
    if (a.length == 0) a.length = k;
    if (k != a.length) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    uint64_t key = (uint64_t(skey) << 32) | push;
    if (skey < 256) {  // a worker's pushes come in order; a switch's batches in any
      auto last = a.last_push.find(skey);
      if (last != a.last_push.end() && !tag_newer(push, last->second)) {
        ++c_[DUPLICATES];
        return;
      }
      a.last_push[skey] = push;
    } else {
      if (a.taken.count(key)) {
        ++c_[DUPLICATES];
        return;
      }
      a.taken[key] = true;
      a.taken_order.push_back(key);
      if (a.taken_order.size() > 1024) {
        a.taken.erase(a.taken_order.front());
        a.taken_order.pop_front();
      }
    }
    auto f = fresh_.find(key);
    bool fresh;
    if (f == fresh_.end()) {  // the first segment of this gradient decides for all of it
      fresh = ((a.number - rnd) & 0xFFu) <= thr_s_;
      fresh_[key] = fresh;
      fresh_order_.push_back(key);
      if (fresh_order_.size() > 4096) {
        fresh_.erase(fresh_order_.front());
        fresh_order_.pop_front();
      }
    } else {
      fresh = f->second;
    }
    if (!fresh) {
      ++c_[STALENESS_DROPPED];
      return;
    }
    if (!a.contrib.empty() && a.count + count > uint32_t(L_.max_count)) complete_offset(o, a);
    a.contrib.push_back({skey, ++arrivals_, std::vector<float>(payload, payload + k)});
    a.count += count;
    a.units += 1;
    c_[BYTES_AGGREGATED] += uint64_t(k) * 4;
    if (a.units >= units_) complete_offset(o, a);
  }

  // ---- a child switch's batches (`PyDataPlane._batch_segment` and the methods after it) ----

  void batch_segment(int skey, uint32_t push, uint32_t o, uint32_t rnd, uint32_t count,
                     uint32_t k, const float* payload) {
    double now = monotonic();
    uint64_t g = (uint64_t(skey) << 32) | push;
    auto it = assigned_.find(g);
    if (it == assigned_.end()) {
      std::shared_ptr<Batch> nb = batch_for(g, o, rnd, count, now);
      it = assigned_.emplace(g, nb).first;
      assigned_order_.push_back(g);
      if (assigned_order_.size() > 4096) {
        assigned_.erase(assigned_order_.front());
        assigned_order_.pop_front();
      }
      if (nb) {
        nb->grads += 1;
        nb->count += count;
        int below = 0;
        for (const Member& x : members_) {
          if (x.active) below += std::max(1, x.workers_below);
        }
        if (int(nb->count) >= std::max(1, below)) nb->closed = true;
      }
    }
    std::shared_ptr<Batch> b = it->second;
    if (!b || !b->versions.count(g)) {  // staler than S already (`batch_for`, `seal`)
      ++c_[STALENESS_DROPPED];
      return;
    }
    if (b->gone || b->sent.count(o)) {
      ++c_[STALE_DROPPED];
      return;
    }
    auto len = b->length.emplace(o, k).first;
    if (len->second != k) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    std::vector<Part>& parts = b->parts[o];
    for (const Part& p : parts) {
      if (p.key == skey && p.push == push) {
        ++c_[DUPLICATES];
        return;
      }
    }
    parts.push_back({skey, push, count, std::vector<float>(payload, payload + k)});
    c_[BYTES_AGGREGATED] += uint64_t(k) * 4;
    b->last = now;
    if (b->closed) send_complete(*b);
  }

  // `PyDataPlane._batch_for`: the batch for gradient g of version rnd, or none where it is
  // staler than S already.
  std::shared_ptr<Batch> batch_for(uint64_t g, uint32_t o, uint32_t rnd, uint32_t count,
                                   double now) {
    const int64_t s = thr_s_;
    auto at = offsets_.find(o);
    int64_t top = at == offsets_.end() ? 0 : int64_t(at->second.number);
    int64_t lag = int64_t((uint32_t(top) - rnd) & 0xFFu);
    if (lag > s) return nullptr;
    int64_t version = top - lag;
    std::shared_ptr<Batch> found;
    for (auto& b : batches_) {
      if (b->key != o || b->closed) continue;
      if (b->count + count > uint32_t(L_.max_count) || top - b->oldest > s) {
        b->closed = true;
        send_complete(*b);
      } else {
        found = b;  // (the offset's one open batch)
      }
    }
    if (!found) {
      found = std::make_shared<Batch>();
      found->number = batch_number_;
      found->key = o;
      found->oldest = version;
      found->opened = found->last = now;
      batch_number_ = (batch_number_ + 1) % kTagMod;
      batches_.push_back(found);
    }
    found->oldest = std::min(found->oldest, version);
    found->versions[g] = {version, count};
    return found;
  }

  // `PyDataPlane._seal`: before a batch's first partial goes up, leave out its gradients that
  // became staler than S while it waited; the rest, and their oldest version, are fixed.
  void seal(Batch& b) {
    b.sealed = true;
    auto at = offsets_.find(b.key);
    int64_t top = at == offsets_.end() ? 0 : int64_t(at->second.number);
    bool any = false;
    for (auto v = b.versions.begin(); v != b.versions.end();) {
      if (top - v->second.first > int64_t(thr_s_)) {
        b.grads -= 1;
        b.count -= v->second.second;
        v = b.versions.erase(v);
        any = true;
      } else {
        ++v;
      }
    }
    if (!any) return;
    for (auto& [o, parts] : b.parts) {
      size_t before = parts.size();
      parts.erase(std::remove_if(parts.begin(), parts.end(), [&](const Part& p) {
                    return !b.versions.count((uint64_t(p.key) << 32) | p.push);
                  }), parts.end());
      c_[STALENESS_DROPPED] += before - parts.size();
    }
    if (b.versions.empty()) {
      b.gone = true;
      return;
    }
    b.oldest = std::numeric_limits<int64_t>::max();
    for (const auto& [g, v] : b.versions) b.oldest = std::min(b.oldest, v.first);
  }

  void send_complete(Batch& b) {
    if (!b.sealed) seal(b);
    for (auto& [o, parts] : b.parts) {
      if (!b.sent.count(o) && int(parts.size()) == b.grads) send_partial(b, o);
    }
  }

  // Batch b's partial at offset o as it is (ascending sender, then push).
  void send_partial(Batch& b, uint32_t o) {
    if (!b.sealed) seal(b);
    std::vector<Part>& parts = b.parts[o];
    if (parts.empty()) return;
    std::sort(parts.begin(), parts.end());
    std::vector<float>& total = b.totals[o] = std::move(parts[0].data);
    uint32_t n = parts[0].count;
    for (size_t r = 1; r < parts.size(); ++r) {
      const float* __restrict c = parts[r].data.data();
      for (size_t j = 0; j < total.size(); ++j) total[j] += c[j];
      n += parts[r].count;
    }
    b.sent.insert(o);
    parts.clear();
    ++c_[SEGMENTS_COMPLETED];
    queue(parent_, ((b.number % kTagMod) << 16) | o, uint32_t(b.oldest) & 0xFFu,
          uint32_t(member_id_), n, L_.flag_async, total.data(), uint32_t(total.size()), 0);
  }

  // Close every batch; send every partial it holds as it is, or (`whole`) only those every
  // gradient of the batch gave (`PyDataPlane._flush_batches`).
  void flush_batches(bool whole = false) {
    for (auto& b : batches_) {
      b->closed = true;
      if (whole) {
        send_complete(*b);
        continue;
      }
      for (auto& [o, parts] : b->parts) {
        if (!parts.empty() && !b->sent.count(o)) send_partial(*b, o);
      }
    }
  }

  void tick_batches(double now) {
    std::deque<std::shared_ptr<Batch>> keep, retired;
    for (auto& b : batches_) {
      if (!b->closed && now - b->opened >= help_after_) {
        b->closed = true;
        send_complete(*b);
      }
      if (b->closed && now - b->last >= help_after_) {
        for (auto& [o, parts] : b->parts) {
          if (!parts.empty() && !b->sent.count(o)) send_partial(*b, o);
        }
        if (now - b->last >= 2 * help_after_) {
          b->gone = true;  // (kept in assigned_ as such: later segments of its gradients drop)
          retired.push_back(b);
          continue;
        }
      }
      keep.push_back(b);
    }
    flush();  // queued sends may still read a retired batch's partial
    for (auto& b : retired) {
      b->parts.clear();
      b->totals.clear();
    }
    batches_.swap(keep);
  }

  void clear_batches() {
    flush();  // queued sends may still read a partial
    batches_.clear();
    assigned_.clear();
    assigned_order_.clear();
  }

  // Sum an offset's open aggregate (ascending member id, then arrival; a zero sum of count 1
  // when empty), keep it, send it to every member; the next aggregate opens.
  void complete_offset(uint32_t o, Offset& a) {
    std::sort(a.contrib.begin(), a.contrib.end());
    std::vector<float> total(a.length, 0.0f);
    if (!a.contrib.empty()) {
      total = a.contrib[0].data;
      for (size_t r = 1; r < a.contrib.size(); ++r) {
        const float* __restrict c = a.contrib[r].data.data();
        for (size_t j = 0; j < a.length; ++j) total[j] += c[j];
      }
    }
    if (a.number >= kKept) {
      auto old = a.kept.find(a.number - kKept);
      if (old != a.kept.end()) {
        flush();  // queued sends may still read it
        a.kept.erase(old);
      }
    }
    a.kept[a.number] = {std::move(total), std::max<uint32_t>(a.count, 1)};
    ++c_[SEGMENTS_COMPLETED];
    ++c_[AGGREGATES_COMPLETED];
    for (const Member& m : members_) {
      if (m.active) send_kept(o, a, a.number, m.addr, L_.flag_result | L_.flag_async);
    }
    ++a.number;
    a.contrib.clear();
    a.count = 0;
    a.units = 0;
  }

  // A child switch's threshold-mode result from its parent: kept (the last kKept per offset,
  // for Help) and sent to every member, once (`PyDataPlane._on_parent_async`).
  void on_parent_async(uint32_t seq, uint32_t count, uint32_t k, const float* payload) {
    uint32_t tag = (seq >> 16) % kTagMod, o = seq & 0xFFFFu;
    Offset& a = offsets_[o];
    if (a.length == 0) a.length = k;
    int64_t ahead = (tag - a.number) % kTagMod;
    int64_t at = int64_t(a.number) + ahead - (ahead < kTagMod / 2 ? 0 : kTagMod);
    if (k != a.length) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    uint32_t number = uint32_t(at);
    if (at < 0 || at <= int64_t(a.number) - int64_t(kKept) || a.kept.count(number)) {
      ++c_[DUPLICATES];
      return;
    }
    if (a.kept.size() >= kKept) flush();  // queued sends may still read the one dropped
    a.kept[number] = {std::vector<float>(payload, payload + k), count};
    a.number = std::max(a.number, number + 1);
    while (a.kept.size() > kKept) a.kept.erase(a.kept.begin());
    for (const Member& m : members_) {
      if (m.active) send_kept(o, a, number, m.addr, L_.flag_result | L_.flag_async);
    }
  }

  void send_kept(uint32_t o, const Offset& a, uint32_t number, const sockaddr_in& to,
                 uint32_t flags) {
    const auto& kept = a.kept.at(number);
    queue(to, ((number % kTagMod) << 16) | o, number, uint32_t(switch_id_), kept.second, flags,
          kept.first.data(), a.length, 0);
  }

  void on_result(uint32_t seq, uint32_t count, uint32_t k, const float* payload) {
    uint32_t idx = seq & mask_;
    Slot& s = slots_[idx];
    if (s.seq != seq || (s.state != UP && s.state != DONE)) {
      ++c_[STALE_DROPPED];
      return;
    }
    if (s.state == DONE) {
      ++c_[DUPLICATES];
      return;
    }
    if (k != s.length) {
      ++c_[MALFORMED_DROPPED];
      return;
    }
    if (pending_refs_[idx]) flush();
    std::memcpy(result_ptr(idx), payload, size_t(k) * 4);
    s.result_count = count;
    s.state = DONE;
    active_.erase(idx);
    for (const Member& m : members_) {
      if (m.active) send_result(idx, m.addr, L_.flag_result);
    }
  }

  // Sum the slot's rows in ascending member id (the Python plane's order, so the float32 result
  // is bit-identical whatever the arrival order), then send it on.
  void complete(uint32_t idx, double now) {
    Slot& s = slots_[idx];
    std::sort(s.contrib.begin(), s.contrib.end());
    size_t k = s.length;
    if (pending_refs_[idx]) flush();
    float* __restrict out = partial_ptr(idx);
    const float* __restrict a = row_ptr(idx, s.contrib[0].second);
    if (s.contrib.size() == 1) {
      std::memcpy(out, a, k * 4);
    } else {
      const float* __restrict b = row_ptr(idx, s.contrib[1].second);
      for (size_t j = 0; j < k; ++j) out[j] = a[j] + b[j];
      for (size_t r = 2; r < s.contrib.size(); ++r) {
        const float* __restrict c = row_ptr(idx, s.contrib[r].second);
        for (size_t j = 0; j < k; ++j) out[j] += c[j];
      }
    }
    ++c_[SEGMENTS_COMPLETED];
    if (has_parent_) {
      if (!batches_.empty()) flush_batches();  // (a barrier's round: earlier gradients first)
      s.state = UP;
      s.helped = now;
      send_up(idx);
    } else {
      s.state = DONE;
      s.result_count = s.count;
      active_.erase(idx);
      for (const Member& m : members_) {
        if (m.active) send_result(idx, m.addr, L_.flag_result);
      }
    }
  }

  void send_up(uint32_t idx) {
    const Slot& s = slots_[idx];
    queue(parent_, s.seq, s.round, uint32_t(member_id_), s.count, 0, partial_ptr(idx), s.length,
          idx);
  }

  void send_result(uint32_t idx, const sockaddr_in& to, uint32_t flags) {
    const Slot& s = slots_[idx];
    queue(to, s.seq, s.round, uint32_t(switch_id_), s.result_count, flags, result_ptr(idx),
          s.length, idx);
  }

  // One data packet out, with the send-side faults; batched into the next sendmmsg.
  void queue(const sockaddr_in& to, uint32_t seq, uint32_t rnd, uint32_t member, uint32_t count,
             uint32_t flags, const float* payload, uint32_t k, uint32_t idx) {
    if (drop_ > 0 && uniform() < drop_) {
      ++c_[INJECTED_DROPS];
      return;
    }
    int times = (dup_ > 0 && uniform() < dup_) ? 2 : 1;
    for (int t = 0; t < times; ++t) {
      ++c_[PACKETS_OUT];
      if (ntx_ == kTx) flush();
      uint8_t* hdr = &tx_hdr_[size_t(ntx_) * L_.header_bytes];
      std::memset(hdr, 0, L_.header_bytes);
      L_.seq.write(hdr, seq);
      L_.round.write(hdr, rnd & 0xFF);
      L_.member.write(hdr, member);
      L_.count.write(hdr, count);
      L_.flags.write(hdr, flags);
      if (delay_s_ > 0) {
        std::vector<uint8_t> b(hdr, hdr + L_.header_bytes);
        const uint8_t* p = reinterpret_cast<const uint8_t*>(payload);
        b.insert(b.end(), p, p + size_t(k) * 4);
        delayed_.push_back({monotonic() + delay_s_, to, false, std::move(b)});
        continue;
      }
      tx_to_[ntx_] = to;
      tx_iov_[2 * ntx_] = {hdr, size_t(L_.header_bytes)};
      tx_iov_[2 * ntx_ + 1] = {const_cast<float*>(payload), size_t(k) * 4};
      tx_slot_[ntx_] = idx;
      ++pending_refs_[idx];
      ++ntx_;
    }
  }

  // Everything queued goes out; a datagram the kernel refuses (full buffer, a peer's ICMP
  // error) is dropped as UDP would. With GSO, the packets for one destination, in queue order,
  // form UDP_SEGMENT messages of up to `gso_max_` datagrams (header and payload iovecs after
  // one another, pointing into the pool); a shorter datagram ends its message.
  void flush() {
    if (ntx_ == 0) return;
    int nmsg = gso_ ? pack_gso() : pack_plain();
    int i = 0;
    while (i < nmsg) {
      int r = sendmmsg(fd_, &tx_msgs_[i], unsigned(nmsg - i), 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (gso_ && (errno == EINVAL || errno == EIO || errno == EMSGSIZE) &&
            tx_msgs_[i].msg_hdr.msg_controllen) {
          gso_ = false;  // segmentation refused here (path MTU, kernel): plain datagrams on
          nmsg = pack_plain();
          i = 0;
          continue;
        }
        ++i;  // EAGAIN, ECONNREFUSED, ...: this message is lost
      } else {
        i += std::max(r, 1);
      }
    }
    for (int j = 0; j < ntx_; ++j) pending_refs_[tx_slot_[j]] = 0;
    ntx_ = 0;
  }

  int pack_plain() {
    for (int i = 0; i < ntx_; ++i) {
      msghdr& h = tx_msgs_[i].msg_hdr;
      h = msghdr{};
      h.msg_name = &tx_to_[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &tx_iov_[2 * i];
      h.msg_iovlen = 2;
    }
    return ntx_;
  }

  // Each packet not yet packed starts a message that takes the later ones to its destination.
  int pack_gso() {
    std::vector<uint8_t>& used = gso_used_;
    used.assign(size_t(ntx_), 0);
    int nmsg = 0;
    size_t pos = 0;
    for (int first = 0; first < ntx_; ++first) {
      if (used[first]) continue;
      uint64_t dest = addr_key(tx_to_[first]);
      int count = 0;
      size_t start = pos;
      for (int j = first; j < ntx_ && count < gso_max_; ++j) {
        if (used[j] || addr_key(tx_to_[j]) != dest) continue;
        size_t n = tx_iov_[2 * j].iov_len + tx_iov_[2 * j + 1].iov_len;
        used[j] = 1;
        gso_iov_[pos++] = tx_iov_[2 * j];  // the kernel cuts the concatenation, no copy here
        gso_iov_[pos++] = tx_iov_[2 * j + 1];
        ++count;
        if (n != full_bytes_) break;  // a short datagram can only be the last of a GSO send
      }
      msghdr& h = tx_msgs_[nmsg].msg_hdr;
      h = msghdr{};
      h.msg_name = &tx_to_[first];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &gso_iov_[start];
      h.msg_iovlen = pos - start;
      if (count > 1) {
        set_udp_segment(h, &gso_cmsg_[size_t(nmsg) * kSegCmsg], full_bytes_);
      }
      ++nmsg;
    }
    return nmsg;
  }

  void send_one(const sockaddr_in& to, const uint8_t* data, size_t n, bool control) {
    iovec iov{const_cast<uint8_t*>(data), n};
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
    msghdr h{};
    sockaddr_in dst = to;
    h.msg_name = &dst;
    h.msg_namelen = sizeof dst;
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    if (control) {
      h.msg_control = cbuf;
      h.msg_controllen = sizeof cbuf;
      cmsghdr* cm = CMSG_FIRSTHDR(&h);
      cm->cmsg_level = IPPROTO_IP;
      cm->cmsg_type = IP_TOS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      int tos = L_.tos_control;
      std::memcpy(CMSG_DATA(cm), &tos, sizeof tos);
    }
    while (sendmsg(fd_, &h, 0) < 0 && errno == EINTR) {
    }
  }

  int fd_;
  Layout L_;
  int seg_, max_members_, switch_id_, member_id_;
  double drop_, dup_, delay_s_, help_after_;
  uint32_t mask_ = 0;
  bool has_parent_ = false, ready_ = false;
  int threshold_ = 0;
  // threshold mode
  bool thr_on_ = false;
  uint32_t thr_h_ = 0, thr_s_ = 0, units_ = 1;
  uint64_t arrivals_ = 0;
  std::map<uint32_t, Offset> offsets_;
  std::unordered_map<uint64_t, bool> fresh_;  // (member id, push) -> within S
  std::deque<uint64_t> fresh_order_;
  std::deque<std::shared_ptr<Batch>> batches_;  // a child's, open or sending, in batch order
  std::unordered_map<uint64_t, std::shared_ptr<Batch>> assigned_;  // (key, push) -> batch
  std::deque<uint64_t> assigned_order_;
  uint32_t batch_number_ = 0;
  sockaddr_in parent_{};
  std::mt19937_64 rng_;
  std::vector<float> rows_, partial_, result_;
  std::vector<Slot> slots_;
  std::vector<Member> members_;
  std::vector<double> last_seen_;
  std::unordered_map<uint64_t, int> addr_row_;
  struct ActiveSet {  // the slots in FILLING or UP, in a flag array plus a list
    std::vector<uint8_t> in;
    std::vector<int> list;
    void insert(int i) {
      if (!in[i]) {
        in[i] = 1;
        list.push_back(i);
      }
    }
    void erase(int i) {
      if (in[i]) {
        in[i] = 0;
        list.erase(std::find(list.begin(), list.end(), i));
      }
    }
    void clear() {
      std::fill(in.begin(), in.end(), 0);
      list.clear();
    }
    std::vector<int>::const_iterator begin() const { return list.begin(); }
    std::vector<int>::const_iterator end() const { return list.end(); }
  } active_;
  std::vector<uint16_t> pending_refs_;
  std::deque<Delayed> delayed_;
  uint64_t c_[NUM_COUNTERS] = {};
  // receive batch
  std::vector<uint8_t> rx_, rx_cmsg_;
  std::vector<sockaddr_in> rx_from_;
  std::vector<iovec> rx_iov_;
  std::vector<mmsghdr> rx_msgs_;
  // send batch
  std::vector<uint8_t> tx_hdr_;
  std::vector<iovec> tx_iov_;
  std::vector<sockaddr_in> tx_to_;
  std::vector<mmsghdr> tx_msgs_;
  std::vector<uint32_t> tx_slot_;
  int ntx_ = 0;
  // UDP generic segmentation
  bool gro_ = false, gso_ = false;
  size_t full_bytes_ = 0;
  int gso_max_ = 1;
  std::vector<uint8_t> gso_cmsg_, gso_used_;
  std::vector<iovec> gso_iov_;
};


// A worker's side of the data path (`SwitchReducer`): segmented sends straight from the input
// vector, and the check of a GRO buffer of results, without a Python call per datagram.
class ClientPath {
 public:
  ClientPath(int fd, const py::dict& layout) : fd_(fd), L_(layout) {}

  // Segments [lo, hi) of `inp` (float32, `seg_floats` per segment, the last may be shorter),
  // numbered base + i, as UDP_SEGMENT messages to (ip, port). Returns how many segments went
  // out before the kernel refused segmentation (hi - lo when it never did); the caller sends
  // the rest one by one.
  int64_t send(const std::string& ip, int port, py::buffer inp, int64_t seg_floats, int64_t lo,
               int64_t hi, int64_t base, int round, int member, int flags) {
    py::buffer_info b = inp.request();
    const uint8_t* data = static_cast<const uint8_t*>(b.ptr);
    size_t total = size_t(b.size) * size_t(b.itemsize);
    size_t step = size_t(seg_floats) * 4, full = size_t(L_.header_bytes) + step;
    int64_t per = std::min<int64_t>(64, int64_t(kGsoBytes / full));
    if (per < 2 || hi <= lo || size_t(hi - 1) * step >= total) return 0;
    sockaddr_in to = make_addr(ip, port);
    int64_t n = hi - lo, nmsg = (n + per - 1) / per;
    hdr_.assign(size_t(n) * L_.header_bytes, 0);
    iov_.resize(size_t(2 * n));
    msgs_.assign(size_t(nmsg), mmsghdr{});
    cmsg_.assign(size_t(nmsg) * kSegCmsg, 0);
    for (int64_t j = 0; j < n; ++j) {
      uint8_t* h = &hdr_[size_t(j) * L_.header_bytes];
      L_.seq.write(h, uint32_t(base + lo + j));
      L_.round.write(h, uint32_t(round) & 0xFF);
      L_.member.write(h, uint32_t(member));
      L_.count.write(h, 1);
      L_.flags.write(h, uint32_t(flags));
      size_t at = size_t(lo + j) * step;
      iov_[2 * j] = {h, size_t(L_.header_bytes)};
      iov_[2 * j + 1] = {const_cast<uint8_t*>(data + at), std::min(step, total - at)};
    }
    for (int64_t k = 0; k < nmsg; ++k) {
      int64_t first = k * per, count = std::min(per, n - first);
      msghdr& h = msgs_[k].msg_hdr;
      h.msg_name = &to;
      h.msg_namelen = sizeof to;
      h.msg_iov = &iov_[size_t(2 * first)];
      h.msg_iovlen = size_t(2 * count);
      if (count > 1) set_udp_segment(h, &cmsg_[size_t(k) * kSegCmsg], full);
    }
    int64_t k = 0;
    while (k < nmsg) {
      int r = sendmmsg(fd_, &msgs_[k], unsigned(nmsg - k), 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL || errno == EIO || errno == EMSGSIZE || errno == ENOPROTOOPT) {
          return k * per;  // segmentation refused: the rest goes one by one
        }
        ++k;  // EAGAIN, ECONNREFUSED, ...: this message is lost, as UDP would
      } else {
        k += std::max(r, 1);
      }
    }
    return n;
  }

  // The full datagrams of `seg` bytes at the start of `rx[:nbytes]` (a GRO buffer): when there
  // are at least two and they are results with one count and consecutive seq, returns
  // (first seq, how many, count); else None (the caller takes them one by one).
  py::object results(py::buffer rx, int64_t nbytes, int64_t seg) {
    py::buffer_info b = rx.request();
    const uint8_t* p = static_cast<const uint8_t*>(b.ptr);
    if (seg <= L_.header_bytes || nbytes > int64_t(b.size) * int64_t(b.itemsize)) {
      return py::none();
    }
    int64_t m = nbytes / seg;
    if (m < 2) return py::none();
    uint32_t seq0 = L_.seq.read(p), count = L_.count.read(p);
    if (count == 0) return py::none();
    for (int64_t j = 0; j < m; ++j) {
      const uint8_t* h = p + j * seg;
      uint32_t flags = L_.flags.read(h);
      if (!(flags & L_.flag_result) || (flags & ~L_.known_flags) || L_.count.read(h) != count ||
          L_.seq.read(h) != uint32_t(seq0 + uint32_t(j))) {
        return py::none();
      }
    }
    return py::make_tuple(seq0, m, count);
  }

  // The worker's receive loop for the round in flight whose segment i has stream index
  // base + i: reads buffers from the switch at (ip, port) without waiting, and while a buffer
  // holds only result datagrams of this round's segments, writes each new one's mean (payload
  // / count, as the Python path divides) into `out` at segment i, marks done[i] and drops
  // duplicates and results of segments not sent yet (as the Python path does). Returns
  // (results taken, the highest segment index taken or -1, pending): pending is None when the
  // socket has nothing more, else (nbytes, tos, (ip, port), seg bytes) of a buffer left in
  // `rx` for the Python path (control packets, other rounds, malformed datagrams, strangers,
  // and results summed over another count than `want_count` where it is > 0: the Python path
  // decides what such a result means).
  py::tuple take(py::buffer rx, py::buffer out, py::buffer done, int64_t base, int64_t sent,
                 int64_t seg_floats, const std::string& ip, int port, int64_t want_count) {
    py::buffer_info rb = rx.request(true), ob = out.request(true), db = done.request(true);
    if (ob.itemsize != 4 || db.itemsize != 1) throw std::invalid_argument("out: float32, done: bool");
    uint8_t* buf = static_cast<uint8_t*>(rb.ptr);
    size_t cap = size_t(rb.size) * size_t(rb.itemsize);
    float* dst = static_cast<float*>(ob.ptr);
    uint8_t* flags_done = static_cast<uint8_t*>(db.ptr);
    int64_t total = ob.size, nseg = db.size;
    sockaddr_in want = make_addr(ip, port);
    int64_t taken = 0, last = -1;
    alignas(cmsghdr) uint8_t control[kCmsg];
    while (true) {
      sockaddr_in from{};
      iovec iov{buf, cap};
      msghdr h{};
      h.msg_name = &from;
      h.msg_namelen = sizeof from;
      h.msg_iov = &iov;
      h.msg_iovlen = 1;
      h.msg_control = control;
      h.msg_controllen = sizeof control;
      ssize_t r = recvmsg(fd_, &h, MSG_DONTWAIT);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        continue;  // an ICMP error queued on the socket (the switch restarting): read on
      }
      size_t nbytes = size_t(r);
      int tos = 0, gso = 0;
      read_cmsgs(h, tos, gso);
      size_t seg = (gso > 0 && size_t(gso) < nbytes) ? size_t(gso) : nbytes;
      bool ours = from.sin_addr.s_addr == want.sin_addr.s_addr && from.sin_port == want.sin_port &&
                  tos == L_.tos_data && nbytes > 0;
      if (ours) {  // every datagram a well-formed result of this round's segments?
        for (size_t off = 0; off < nbytes && ours; off += seg) {
          size_t len = std::min(seg, nbytes - off);
          const uint8_t* d = buf + off;
          size_t payload = len > size_t(L_.header_bytes) ? len - size_t(L_.header_bytes) : 0;
          uint32_t fl = payload ? L_.flags.read(d) : 0;
          int64_t i = int64_t(uint32_t(L_.seq.read(d) - uint32_t(base)));
          int64_t k = int64_t(payload / 4);
          ours = payload >= 4 && payload % 4 == 0 && (fl & L_.flag_result) &&
                 !(fl & ~L_.known_flags) && L_.count.read(d) != 0 && i < nseg &&
                 k == std::min(seg_floats, total - i * seg_floats) &&
                 (want_count <= 0 || int64_t(L_.count.read(d)) == want_count);
        }
      }
      if (!ours) {
        char text[INET_ADDRSTRLEN] = {0};
        inet_ntop(AF_INET, &from.sin_addr, text, sizeof text);
        return py::make_tuple(taken, last,
                              py::make_tuple(int64_t(nbytes), tos,
                                             py::make_tuple(std::string(text), int(ntohs(from.sin_port))),
                                             int64_t(seg)));
      }
      for (size_t off = 0; off < nbytes; off += seg) {
        const uint8_t* d = buf + off;
        int64_t i = int64_t(uint32_t(L_.seq.read(d) - uint32_t(base)));
        if (i >= sent || flags_done[i]) continue;  // not sent yet (stale) or a duplicate
        int64_t k = std::min(seg_floats, total - i * seg_floats);
        float count = float(L_.count.read(d));
        float* o = dst + i * seg_floats;
        const uint8_t* src = d + L_.header_bytes;
        for (int64_t j = 0; j < k; ++j) {
          float v;
          std::memcpy(&v, src + 4 * j, 4);
          o[j] = v / count;
        }
        flags_done[i] = 1;
        ++taken;
        last = std::max(last, i);
      }
    }
    return py::make_tuple(taken, last, py::none());
  }

 private:
  int fd_;
  Layout L_;
  std::vector<uint8_t> hdr_, cmsg_;
  std::vector<iovec> iov_;
  std::vector<mmsghdr> msgs_;
};

}  // namespace

PYBIND11_MODULE(_plane, m) {
  m.doc() = "The switch daemon's native data plane (csrc/switch_plane.cpp).";
  py::class_<NativePlane>(m, "NativePlane")
      .def(py::init<int, const py::dict&, int, int, int, int, int, py::object, double, double,
                    double, double, py::object, const std::vector<std::string>&>(),
           py::arg("fd"), py::arg("layout"), py::arg("seg_floats"), py::arg("slots"),
           py::arg("max_members"), py::arg("switch_id"), py::arg("member_id"), py::arg("parent"),
           py::arg("drop_rate"), py::arg("dup_rate"), py::arg("delay_ms"),
           py::arg("help_after_s"), py::arg("seed"), py::arg("counters"))
      .def("set_member", &NativePlane::set_member)
      .def("remove_member", &NativePlane::remove_member)
      .def("set_state", &NativePlane::set_state)
      .def("last_seen", &NativePlane::last_seen)
      .def("drain", &NativePlane::drain)
      .def("reset_slots", &NativePlane::reset_slots)
      .def("fbcast", &NativePlane::fbcast)
      .def("help_from_member", &NativePlane::help_from_member)
      .def("async_numbers", &NativePlane::async_numbers)
      .def("help_from_parent", &NativePlane::help_from_parent)
      .def("tick", &NativePlane::tick)
      .def("send_control", &NativePlane::send_control)
      .def("next_due", &NativePlane::next_due)
      .def("flush_delayed", &NativePlane::flush_delayed)
      .def("counters", &NativePlane::counters)
      .def("set_threshold_mode", &NativePlane::set_threshold_mode)
      .def_property_readonly("threshold_mode", &NativePlane::threshold_mode);
  py::class_<ClientPath>(m, "ClientPath")
      .def(py::init<int, const py::dict&>(), py::arg("fd"), py::arg("layout"))
      .def("send", &ClientPath::send)
      .def("results", &ClientPath::results)
      .def("take", &ClientPath::take);
}
