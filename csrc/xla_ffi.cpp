// gmi_drl.envs._xla_ffi: a pool's send and recv as XLA FFI handlers, so that they run inside
// `jax.jit` (EnvPool's `xla()` interface; gmi_drl/envs/xla.py is the Python side).
//
// A pool is registered here under an id; the jitted program carries that id as its "handle",
// an (8,) uint8 array that every call takes and returns, so the data dependency on it keeps
// XLA from reordering, merging or dropping the calls (they are declared side-effecting too).
// Each handler takes the GIL and calls the pool's own `send`/`recv` (the same validation,
// errors and arithmetic as in Python: the per-env random generators that make resets equal
// Gymnasium's are Python objects), with the actions copied out of XLA's operand and the
// batch copied, cast to the result dtypes XLA asked for, into XLA's result buffers. A
// Python exception, a handle of no live pool, or a buffer of the wrong shape or dtype becomes
// an FFI error, which jax raises from the jitted call.
//
// Built only where jax is importable at build time (setup.py): the headers are jax's
// (`jax.ffi.include_dir()`); nothing links against jaxlib.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace {

// A registered pool: a weak reference (the jitted program must not keep a pool alive) and the
// names of the results of recv after obs, reward, terminated, truncated: keys of its info.
struct Port {
  py::object pool_ref;
  std::vector<std::string> info_keys;
};

// Touched with the GIL held only (registration from Python, handlers under gil_scoped_acquire).
std::unordered_map<uint64_t, Port>& ports() {
  static auto* p = new std::unordered_map<uint64_t, Port>();  // never destroyed: no exit order
  return *p;
}
uint64_t next_id = 1;

constexpr size_t kHandleBytes = sizeof(uint64_t);

bool is_handle(const ffi::AnyBuffer& b) {
  return b.element_type() == ffi::DataType::U8 && b.element_count() == kHandleBytes;
}

// The pool id in `handle`, which is copied to the call's handle result `out`.
ffi::ErrorOr<uint64_t> pass_handle(const ffi::AnyBuffer& handle, ffi::AnyBuffer& out) {
  if (!is_handle(handle) || !is_handle(out))
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "gmi-drl xla: the handle must be the (8,) uint8 array of pool.xla() (operand and "
        "first result)"));
  std::memcpy(out.untyped_data(), handle.untyped_data(), kHandleBytes);
  uint64_t id;
  std::memcpy(&id, handle.untyped_data(), kHandleBytes);
  return id;
}

// The live pool of handle `id`, or an error naming why there is none.
ffi::ErrorOr<py::object> live_pool(uint64_t id, Port** port) {
  auto it = ports().find(id);
  py::object pool = it == ports().end() ? py::none() : it->second.pool_ref();
  if (pool.is_none())
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "gmi-drl xla: handle " + std::to_string(id) + " names no live pool (it was garbage-"
        "collected, or the handle is not one of pool.xla())"));
  *port = &it->second;
  return pool;
}

// The pending Python exception as an FFI error: INVALID_ARGUMENT for a ValueError or TypeError
// (the caller's input), INTERNAL for anything else (a closed pool, a failed env).
ffi::Error python_error(const char* what, py::error_already_set& e) {
  std::string msg = std::string("gmi-drl xla: pool.") + what + "() raised " + e.what();
  if (e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError))
    return ffi::Error::InvalidArgument(std::move(msg));
  return ffi::Error::Internal(std::move(msg));
}

// numpy.<name>, looked up once (GIL held); never released: modules outlive the handlers' use.
py::handle numpy_attr(const char* name) {
  return py::object(py::module_::import("numpy").attr(name)).release();
}

const char* numpy_dtype(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::S8: return "int8";
    case ffi::DataType::S16: return "int16";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U16: return "uint16";
    case ffi::DataType::U32: return "uint32";
    case ffi::DataType::U64: return "uint64";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    default: return nullptr;
  }
}

// A NumPy array holding a copy of an XLA operand (the operand is only valid during the call).
ffi::ErrorOr<py::object> to_numpy(const ffi::AnyBuffer& buf, const char* name) {
  const char* dtype = numpy_dtype(buf.element_type());
  if (dtype == nullptr)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string("gmi-drl xla: ") + name + " has an unsupported dtype"));
  py::tuple shape(buf.dimensions().size());
  for (size_t k = 0; k < buf.dimensions().size(); ++k) shape[k] = buf.dimensions()[k];
  py::bytes data(static_cast<const char*>(buf.untyped_data()), buf.size_bytes());
  static py::handle frombuffer = numpy_attr("frombuffer");
  return frombuffer(data, dtype).attr("reshape")(shape);
}

template <typename D, typename S>
void cast_copy(D* dst, const void* src, size_t n) {
  const S* s = static_cast<const S*>(src);
  for (size_t k = 0; k < n; ++k) dst[k] = static_cast<D>(s[k]);
}

// Copy n values of Python buffer format `fmt` ('?', 'b'..'Q', 'f', 'd') into dst as D.
template <typename D>
bool cast_from(D* dst, const void* src, char fmt, size_t n) {
  switch (fmt) {
    case '?': cast_copy<D, bool>(dst, src, n); return true;
    case 'b': cast_copy<D, int8_t>(dst, src, n); return true;
    case 'B': cast_copy<D, uint8_t>(dst, src, n); return true;
    case 'h': cast_copy<D, int16_t>(dst, src, n); return true;
    case 'H': cast_copy<D, uint16_t>(dst, src, n); return true;
    case 'i': cast_copy<D, int32_t>(dst, src, n); return true;
    case 'I': cast_copy<D, uint32_t>(dst, src, n); return true;
    case 'l': cast_copy<D, long>(dst, src, n); return true;
    case 'L': cast_copy<D, unsigned long>(dst, src, n); return true;
    case 'q': cast_copy<D, long long>(dst, src, n); return true;
    case 'Q': cast_copy<D, unsigned long long>(dst, src, n); return true;
    case 'f': cast_copy<D, float>(dst, src, n); return true;
    case 'd': cast_copy<D, double>(dst, src, n); return true;
    default: return false;
  }
}

bool cast_into(ffi::AnyBuffer& out, const void* src, char fmt, size_t n) {
  void* d = out.untyped_data();
  switch (out.element_type()) {
    case ffi::DataType::PRED: return cast_from(static_cast<bool*>(d), src, fmt, n);
    case ffi::DataType::S8: return cast_from(static_cast<int8_t*>(d), src, fmt, n);
    case ffi::DataType::S16: return cast_from(static_cast<int16_t*>(d), src, fmt, n);
    case ffi::DataType::S32: return cast_from(static_cast<int32_t*>(d), src, fmt, n);
    case ffi::DataType::S64: return cast_from(static_cast<int64_t*>(d), src, fmt, n);
    case ffi::DataType::U8: return cast_from(static_cast<uint8_t*>(d), src, fmt, n);
    case ffi::DataType::U16: return cast_from(static_cast<uint16_t*>(d), src, fmt, n);
    case ffi::DataType::U32: return cast_from(static_cast<uint32_t*>(d), src, fmt, n);
    case ffi::DataType::U64: return cast_from(static_cast<uint64_t*>(d), src, fmt, n);
    case ffi::DataType::F32: return cast_from(static_cast<float*>(d), src, fmt, n);
    case ffi::DataType::F64: return cast_from(static_cast<double*>(d), src, fmt, n);
    default: return false;
  }
}

// Copy a NumPy array of recv into XLA's result `out`, whose shape it must have.
ffi::Error copy_result(const py::object& value, ffi::AnyBuffer out, const std::string& name) {
  static py::handle contiguous = numpy_attr("ascontiguousarray");
  py::object a = py::reinterpret_borrow<py::object>(value);
  Py_buffer view;
  if (PyObject_GetBuffer(a.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
    PyErr_Clear();  // strided (a column of a bigger array): a contiguous copy
    a = contiguous(value);
    if (PyObject_GetBuffer(a.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return ffi::Error::Internal("gmi-drl xla: recv's " + name + " is not a plain array");
    }
  }
  bool same_shape = static_cast<size_t>(view.ndim) == out.dimensions().size();
  for (int k = 0; same_shape && k < view.ndim; ++k)
    same_shape = view.shape[k] == out.dimensions()[k];
  std::string fmt = view.format ? view.format : "B";
  const char code = fmt.empty() ? 0 : fmt.back();  // past a byte-order prefix ('<', '=')
  const bool native = fmt.size() == 1 || fmt[0] == '=' || fmt[0] == '@' ||
                      (fmt[0] == '<' && PY_LITTLE_ENDIAN);
  const bool ok = same_shape && native &&
                  cast_into(out, view.buf, code, static_cast<size_t>(out.element_count()));
  PyBuffer_Release(&view);
  if (!same_shape)
    return ffi::Error::Internal("gmi-drl xla: recv's " + name + " has shape " +
                                py::str(a.attr("shape")).cast<std::string>() +
                                ", not the shape pool.xla() declared");
  if (!ok)
    return ffi::Error::Internal("gmi-drl xla: recv's " + name + " has dtype format '" + fmt +
                                "', which cannot be cast to the declared result dtype");
  return ffi::Error::Success();
}

// send(handle, actions[, env_id]) -> handle: pool.send(actions, env_id) (all envs without ids).
ffi::Error send_impl(ffi::AnyBuffer handle, ffi::AnyBuffer actions, ffi::RemainingArgs env_id,
                     ffi::Result<ffi::AnyBuffer> handle_out) {
  auto id = pass_handle(handle, *handle_out);
  if (id.has_error()) return id.error();
  if (env_id.size() > 1)
    return ffi::Error::InvalidArgument("gmi-drl xla: send takes at most one env_id operand");
  py::gil_scoped_acquire gil;
  try {
    Port* port;
    auto pool = live_pool(*id, &port);
    if (pool.has_error()) return pool.error();
    auto a = to_numpy(actions, "actions");
    if (a.has_error()) return a.error();
    if (env_id.size() == 0) {
      pool->attr("send")(*a);
    } else {
      auto ids_buf = env_id.get<ffi::AnyBuffer>(0);
      if (ids_buf.has_error()) return ids_buf.error();
      auto ids = to_numpy(*ids_buf, "env_id");
      if (ids.has_error()) return ids.error();
      pool->attr("send")(*a, *ids);
    }
  } catch (py::error_already_set& e) {
    return python_error("send", e);
  } catch (const std::exception& e) {  // a result of an unexpected type (pybind11's casts)
    return ffi::Error::Internal(std::string("gmi-drl xla: pool.send(): ") + e.what());
  }
  return ffi::Error::Success();
}

// recv(handle) -> (handle, obs, reward, terminated, truncated, *info[key] for the port's keys).
ffi::Error recv_impl(ffi::AnyBuffer handle, ffi::Result<ffi::AnyBuffer> handle_out,
                     ffi::RemainingRets outs) {
  auto id = pass_handle(handle, *handle_out);
  if (id.has_error()) return id.error();
  py::gil_scoped_acquire gil;
  try {
    Port* port;
    auto pool = live_pool(*id, &port);
    if (pool.has_error()) return pool.error();
    if (outs.size() != 4 + port->info_keys.size())
      return ffi::Error::InvalidArgument("gmi-drl xla: recv has " + std::to_string(outs.size()) +
                                         " results, pool.xla() declared " +
                                         std::to_string(4 + port->info_keys.size()));
    py::tuple batch = pool->attr("recv")();
    static const char* kNames[] = {"obs", "reward", "terminated", "truncated"};
    py::dict info = batch[4];
    for (size_t k = 0; k < outs.size(); ++k) {
      auto out = outs.get<ffi::AnyBuffer>(k);
      if (out.has_error()) return out.error();
      const bool in_info = k >= 4;
      const std::string name = in_info ? "info['" + port->info_keys[k - 4] + "']" : kNames[k];
      if (in_info && !info.contains(port->info_keys[k - 4]))
        return ffi::Error::Internal("gmi-drl xla: recv returned no " + name);
      py::object value = in_info ? py::object(info[port->info_keys[k - 4].c_str()])
                                 : py::object(batch[k]);
      ffi::Error err = copy_result(value, **out, name);
      if (err.failure()) return err;
    }
  } catch (py::error_already_set& e) {
    return python_error("recv", e);
  } catch (const std::exception& e) {  // a result of an unexpected type (pybind11's casts)
    return ffi::Error::Internal(std::string("gmi-drl xla: pool.recv(): ") + e.what());
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GmiDrlSend, send_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(GmiDrlRecv, recv_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets());

PYBIND11_MODULE(_xla_ffi, mod) {
  mod.doc() = "A pool's send/recv as XLA FFI handlers (see gmi_drl/envs/xla.py)";
  mod.attr("HANDLE_BYTES") = kHandleBytes;
  mod.def("handlers", [] {
    py::dict d;
    d["send"] = py::capsule(reinterpret_cast<void*>(GmiDrlSend));
    d["recv"] = py::capsule(reinterpret_cast<void*>(GmiDrlRecv));
    return d;
  }, "{'send': capsule, 'recv': capsule}: the handlers for jax.ffi.register_ffi_target");
  mod.def("register", [](py::object pool, std::vector<std::string> info_keys) {
    const uint64_t id = next_id++;
    ports()[id] = Port{py::module_::import("weakref").attr("ref")(pool), std::move(info_keys)};
    return id;
  }, py::arg("pool"), py::arg("info_keys"),
  "Register `pool` (held weakly) whose recv results after the first four are info[key] of "
  "`info_keys`; return its handle id.");
  mod.def("unregister", [](uint64_t id) { ports().erase(id); }, py::arg("id"),
          "Forget handle `id` (no-op if unknown).");
}
