// Reading a c10d op's arguments for meshprof's native collective recorder (included by
// native_kernel.cpp): the argument layout of an op (one row of meshprof/comm/ops.py's table),
// the bytes and dtype of a tensor argument, and the CRC-32 of a group name (sampling hash).
#pragma once

#include <ATen/core/ivalue.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace meshprof_args {

struct Spec {
  int op_code;     // meshprof OP_CODES value
  int pg_arg;      // argument index of the ProcessGroup
  int in_arg;      // argument holding the input tensors (-1: none)
  int out_arg;     // argument holding the output tensors (-1: none)
  int tensor_arg;  // argument whose first tensor gives the dtype
  int async_arg;   // argument index of async_op (-1: none, always asynchronous)
  int peer_arg;    // argument index of the peer's group rank (-1: none)
  int p2p;         // 0 collective, 1 send, 2 recv
  int wait_thread; // with no future (gloo's reduce_scatter) the op completes in its caller's wait
};

inline uint32_t crc32(const std::string& s) {  // zlib's CRC-32, as Python's zlib.crc32
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char ch : s) {
    c ^= ch;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

inline int64_t bytes_of(const c10::IValue& v) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
  }
  if (v.isList()) {  // tensor lists too: read in place (toTensorList().vec() copied each one)
    int64_t n = 0;
    for (const c10::IValue& e : v.toListRef()) n += bytes_of(e);
    return n;
  }
  return 0;
}

inline int16_t dtype_of(const c10::IValue& v) {
  if (v.isTensor()) return static_cast<int16_t>(v.toTensor().scalar_type());
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      int16_t d = dtype_of(e);
      if (d >= 0) return d;
    }
  }
  return -1;
}

// -- the same, on the typed (unboxed) arguments of a c10d op -----------------------------------
// A typed kernel receives the op's C++ arguments (ProcessGroup.hpp's signatures): Tensor,
// TensorList (ArrayRef<Tensor>), vector<vector<Tensor>>, the ProcessGroup's intrusive_ptr,
// int64_t, bool, ... Each reader takes any of them and answers for the kinds it knows.

inline int64_t nbytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

template <typename T>
int64_t typed_bytes(const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    return nbytes(v);
  } else if constexpr (std::is_same_v<D, at::TensorList> || std::is_same_v<D, std::vector<at::Tensor>>) {
    int64_t n = 0;
    for (const at::Tensor& t : v) n += nbytes(t);
    return n;
  } else if constexpr (std::is_same_v<D, std::vector<std::vector<at::Tensor>>>) {
    int64_t n = 0;
    for (const auto& l : v)
      for (const at::Tensor& t : l) n += nbytes(t);
    return n;
  } else {
    return 0;
  }
}

// The first defined tensor of a tensor argument (nullptr: none).
template <typename T>
const at::Tensor* typed_first(const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    return v.defined() ? &v : nullptr;
  } else if constexpr (std::is_same_v<D, at::TensorList> || std::is_same_v<D, std::vector<at::Tensor>>) {
    for (const at::Tensor& t : v)
      if (t.defined()) return &t;
    return nullptr;
  } else if constexpr (std::is_same_v<D, std::vector<std::vector<at::Tensor>>>) {
    for (const auto& l : v)
      for (const at::Tensor& t : l)
        if (t.defined()) return &t;
    return nullptr;
  } else {
    return nullptr;
  }
}

// The data pointers of a tensor argument's tensors, appended to `out` (undefined ones skipped).
inline void push_ptr(const at::Tensor& t, std::vector<const void*>& out) {
  if (t.defined() && t.has_storage()) out.push_back(t.const_data_ptr());
}

template <typename T>
void typed_ptrs(const T& v, std::vector<const void*>& out) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    push_ptr(v, out);
  } else if constexpr (std::is_same_v<D, at::TensorList> || std::is_same_v<D, std::vector<at::Tensor>>) {
    for (const at::Tensor& t : v) push_ptr(t, out);
  } else if constexpr (std::is_same_v<D, std::vector<std::vector<at::Tensor>>>) {
    for (const auto& l : v)
      for (const at::Tensor& t : l) push_ptr(t, out);
  }
}

inline void ptrs_of(const c10::IValue& v, std::vector<const void*>& out) {
  if (v.isTensor()) {
    push_ptr(v.toTensor(), out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) ptrs_of(e, out);
  }
}

// Whether a tensor argument (Tensor, Tensor?, Tensor[], Tensor[][]) has a tensor requiring grad.
template <typename T>
bool typed_requires_grad(const T& v) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    return v.defined() && v.requires_grad();
  } else if constexpr (std::is_same_v<D, std::optional<at::Tensor>>) {
    return v.has_value() && v->defined() && v->requires_grad();
  } else if constexpr (std::is_same_v<D, at::TensorList> || std::is_same_v<D, std::vector<at::Tensor>>) {
    for (const at::Tensor& t : v)
      if (t.defined() && t.requires_grad()) return true;
    return false;
  } else if constexpr (std::is_same_v<D, std::vector<std::vector<at::Tensor>>>) {
    for (const auto& l : v)
      for (const at::Tensor& t : l)
        if (t.defined() && t.requires_grad()) return true;
    return false;
  } else {
    return false;
  }
}

template <typename T>
int64_t typed_int(const T& v, int64_t otherwise) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, int64_t> || std::is_same_v<D, bool>) {
    return static_cast<int64_t>(v);
  } else {
    return otherwise;
  }
}

// f(the i-th of args...) (nothing when i is out of range): a runtime index into a parameter
// pack, so one reader serves every op's layout (the Spec's argument indices).
template <typename F, typename... A>
inline void visit_arg(int i, F&& f, const A&... args) {
  int k = 0;
  (void)std::initializer_list<int>{(k++ == i ? (f(args), 0) : 0)...};
}

// f(each of args...).
template <typename F, typename... A>
inline void visit_all(F&& f, const A&... args) {
  (void)std::initializer_list<int>{(f(args), 0)...};
}

}  // namespace meshprof_args
