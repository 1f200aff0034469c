// Reading a c10d op's arguments for meshprof's native collective recorder (included by
// native_kernel.cpp): the argument layout of an op (one row of meshprof/comm/ops.py's table),
// the bytes and dtype of a tensor argument, and the CRC-32 of a group name (sampling hash).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>

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
  int wait_thread; // the backend's work has no future and never reports completion: wait on it
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

}  // namespace meshprof_args
