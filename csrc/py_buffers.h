// The per-env state buffers of a pool: NumPy arrays that Python owns and a native core writes.

#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

namespace gmi_drl {

// The writable data of `buffers[name]`, checked to be a C-contiguous array of T with shape
// (rows,) (cols == 1) or (rows, cols). The caller keeps `buffers` alive as long as it writes.
// Raises std::invalid_argument (ValueError in Python) naming the buffer otherwise.
template <typename T>
T* buffer(const pybind11::dict& buffers, const char* name, pybind11::ssize_t rows,
          pybind11::ssize_t cols) {
  if (!buffers.contains(name)) throw std::invalid_argument(std::string("missing buffer ") + name);
  pybind11::array a = buffers[name].cast<pybind11::array>();
  if (!pybind11::isinstance<pybind11::array_t<T>>(a) ||
      !(a.flags() & pybind11::array::c_style) || !a.writeable() || a.ndim() > 2 ||
      a.shape(0) != rows || (a.ndim() == 2 ? a.shape(1) : 1) != cols) {
    throw std::invalid_argument(std::string("buffer ") + name + " has the wrong dtype, shape " +
                                "or layout");
  }
  return static_cast<T*>(a.mutable_data());
}

}  // namespace gmi_drl
