// The records of meshprof's native collective recorder and their device timing (included by
// native_kernel.cpp, one translation unit): the timer interface the resolution logic sees, the
// resolution itself, the CUDA timer (built only with MESHPROF_WITH_CUDA: torch.cuda.is_available()
// and CUDA_HOME at build time) and a scripted stand-in timer that CPU builds test the resolution
// with (through test hooks only).
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#ifdef MESHPROF_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace meshprof_device {

inline std::atomic<bool> device_timing{true};  // ProfilerConfig.device_timing
#ifdef MESHPROF_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

// One record; drained as raw bytes, mirrored by NATIVE_DTYPE in meshprof/comm/native.py.
#pragma pack(push, 1)
struct Rec {
  uint8_t op;
  uint8_t status;  // 0 ok, 1 error
  int16_t dtype;   // c10::ScalarType, -1 none
  uint8_t flags;   // 1 async
  uint8_t sampled; // 0: counted only
  uint16_t group;  // native group id
  int32_t peer;    // peer's group rank, -1
  int64_t seq;
  int64_t in_bytes;
  int64_t out_bytes;
  int64_t t0;      // steady clock (CLOCK_MONOTONIC) ns at issue
  int64_t dur;     // ns, -1 not timed
  int64_t step;
  int64_t token;
  int64_t host_dur;  // device-timed (flags & kDeviceTimed): issue -> host completion ns; else -1
};
#pragma pack(pop)

constexpr uint8_t kAsync = 1;
constexpr uint8_t kDeviceTimed = 2;         // dur is the device time (meshprof FLAG_DEVICE_TIMING)
constexpr uint8_t kDeviceAbandoned = 0x40;  // the device end never resolved in time: host dur


// The device time of one collective, as the resolution logic sees it. Created at issue (the
// start is marked on the issuing stream), attached to the op's work, told when the host saw the
// work complete, then asked -- never blocking -- whether the device has reached the end.
// Every call happens with the kernel's mutex held.
struct DeviceTimer {
  virtual ~DeviceTimer() = default;
  virtual void attach(const c10::intrusive_ptr<c10d::Work>& work) {}
  // The host saw the work complete. on_work_stream: the current stream is ordered after the
  // work (a future's callback; after Work.wait()), so an end marked now follows the op. False
  // when no device time can come any more.
  virtual bool host_done(bool on_work_stream) = 0;
  virtual bool ready() = 0;          // the device reached the end (a non-blocking query)
  virtual int64_t elapsed_ns() = 0;  // only after ready(): start -> end on the device; -1 unknown
};

struct Pending {  // host-complete, waiting for its device end
  Rec rec;
  std::unique_ptr<DeviceTimer> timer;
  int64_t host_end;
};

// Test stand-in (CPU builds too, on only through test_device_script): each op issued while the
// script lasts takes the next (device ns, ready at) entry; its end resolves once the test's
// device clock reaches "ready at". Counts every query, and any elapsed-time question asked
// before the end was reached (a real device would block or fail there).
struct Script {
  bool on = false;
  std::deque<std::pair<int64_t, int64_t>> entries;
  int64_t clock = 0;
  int64_t created = 0, ends = 0, queries = 0, early = 0;
};
inline Script script;  // guarded by the kernel's mutex

struct ScriptedTimer : DeviceTimer {
  int64_t dev_ns, ready_at;
  bool ended = false;
  ScriptedTimer(int64_t d, int64_t at) : dev_ns(d), ready_at(at) {}
  bool host_done(bool on_work_stream) override {
    ended = on_work_stream;
    script.ends += ended ? 1 : 0;
    return ended;
  }
  bool reached() const { return ended && script.clock >= ready_at; }
  bool ready() override {
    ++script.queries;
    return reached();
  }
  int64_t elapsed_ns() override {
    if (!reached()) ++script.early;
    return dev_ns;
  }
};

#ifdef MESHPROF_WITH_CUDA
// Per group: whether the backend's works time themselves (ProcessGroupNCCL with
// TORCH_NCCL_ENABLE_TIMING=1: Work::getDuration()). 0 not known yet, 1 yes, 2 no.
inline std::unordered_map<int, int> work_timing;  // guarded by the kernel's mutex

// CUDA: torch's own timing of the work when its backend has it (WorkNCCL's start and end
// events), else a pair of events of ours: the start on the issuing stream, the end on the stream
// a future's callback runs on (ordered after the work's end). Queried, never synchronized.
struct CudaTimer : DeviceTimer {
  int gid;
  c10::DeviceIndex device;
  bool own;  // recording our own events (the work's timing is not known to be there)
  bool ended = false;
  at::cuda::CUDAEvent start{cudaEventDefault};
  at::cuda::CUDAEvent end{cudaEventDefault};
  c10::intrusive_ptr<c10d::Work> work;

  CudaTimer(int g, c10::DeviceIndex d) : gid(g), device(d), own(work_timing[g] != 1) {
    if (own) start.record(c10::cuda::getCurrentCUDAStream(device));
  }
  void attach(const c10::intrusive_ptr<c10d::Work>& w) override { work = w; }
  bool host_done(bool on_work_stream) override {
    if (own && on_work_stream) {
      end.record(c10::cuda::getCurrentCUDAStream(device));
      ended = true;
    }
    return ended || (work && work_timing[gid] != 2);
  }
  bool ready() override { return ended ? end.query() : work->isCompleted(); }
  int64_t elapsed_ns() override {
    if (work && work_timing[gid] != 2 && work->isCompleted()) {
      try {
        const float ms = work->getDuration();
        work_timing[gid] = 1;
        return static_cast<int64_t>(static_cast<double>(ms) * 1e6);
      } catch (...) {
        work_timing[gid] = 2;  // not this backend, or its timing is off: ours from now on
      }
    }
    if (!ended) return -1;
    return static_cast<int64_t>(static_cast<double>(start.elapsed_time(end)) * 1e6);
  }
};
#endif

inline at::Tensor first_tensor_of(const c10::IValue& v) {
  if (v.isTensor()) return v.toTensor();
  if (v.isTensorList()) {
    auto l = v.toTensorList();
    return l.size() ? l.get(0) : at::Tensor();
  }
  if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      at::Tensor t = first_tensor_of(e);
      if (t.defined()) return t;
    }
  }
  return at::Tensor();
}

// The timer of an op whose first tensor is `t` (nullptr: none; the kernel's mutex held): none
// unless device timing is on and the op runs on a CUDA device in a CUDA build -- or the test
// script is on.
inline std::unique_ptr<DeviceTimer> make_timer(const at::Tensor* t, int gid) {
  if (script.on) {
    if (script.entries.empty()) return nullptr;
    auto e = script.entries.front();
    script.entries.pop_front();
    ++script.created;
    return std::make_unique<ScriptedTimer>(e.first, e.second);
  }
#ifdef MESHPROF_WITH_CUDA
  if (device_timing.load(std::memory_order_relaxed)) {
    if (t != nullptr && t->defined() && t->is_cuda()) {
      return std::make_unique<CudaTimer>(gid, t->device().index());
    }
  }
#endif
  (void)t;
  (void)gid;
  return nullptr;
}

// Move the records whose device end has been reached from `pending` into `done` (the kernel's
// mutex held). Each is resolved on its own (any order); one the device has not reached
// `timeout_ns` after its host completion is given up: it keeps its host duration, flagged
// kDeviceAbandoned. Only non-blocking queries; `now`: steady clock ns.
inline void resolve(std::deque<Pending>& pending, std::vector<Rec>& done, int64_t now,
                    int64_t timeout_ns) {
  if (pending.empty()) return;
  std::deque<Pending> keep;
  for (auto& p : pending) {
    bool reached = false;
    try {
      reached = p.timer->ready();
    } catch (...) {
      reached = true;  // a failing query: no device time (elapsed below says -1)
    }
    if (reached) {
      int64_t d = -1;
      try {
        d = p.timer->elapsed_ns();
      } catch (...) {
        d = -1;
      }
      if (d >= 0) {
        p.rec.dur = d;
        p.rec.flags |= kDeviceTimed;
      } else {
        p.rec.dur = p.rec.host_dur;
        p.rec.host_dur = -1;
      }
      done.push_back(p.rec);
    } else if (now - p.host_end > timeout_ns) {
      p.rec.dur = p.rec.host_dur;
      p.rec.host_dur = -1;
      p.rec.flags |= kDeviceAbandoned;
      done.push_back(p.rec);
    } else {
      keep.push_back(std::move(p));
    }
  }
  pending.swap(keep);
}

}  // namespace meshprof_device
