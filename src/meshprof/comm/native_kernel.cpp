// meshprof's native collective recorder: a C++ kernel at the dispatcher's BackendSelect key for
// every c10d op. It does what the Python kernel (meshprof/comm/python_kernel.py, recorder.py) does
// (group, seq, bytes, dtype, sampling, start time, completion from the Work's future or a polling
// thread), without touching Python or the GIL on the collective's path. Python drains finished records
// (packed, see Rec) with drain(); meshprof/comm/native.py translates them into the event log.
// Device timing (CUDA tensors): an op gets a DeviceTimer at issue; once the host saw it complete
// its record waits in device_pending until the timer says, never blocking, that the device
// reached the end (native_device.h). CPU builds test that with a scripted stand-in timer.
#include <torch/extension.h>

#include <pybind11/chrono.h>

#include <ATen/core/VariableHooksInterface.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "native_args.h"
#include "native_device.h"

#include <atomic>
#include <chrono>
#include <pthread.h>
#include <time.h>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

using meshprof_args::bytes_of;
using meshprof_args::crc32;
using meshprof_args::dtype_of;
using meshprof_args::Spec;
using meshprof_device::DeviceTimer;
using meshprof_device::kAsync;
using meshprof_device::Pending;
using meshprof_device::Rec;
using meshprof_device::script;

std::mutex mu;
std::unordered_map<std::string, Spec> specs;
std::unordered_map<const c10d::ProcessGroup*, int> group_ids;
std::unordered_map<std::string, int> gid_by_name;
std::vector<std::string> group_names;
std::vector<uint32_t> group_crc;
std::unordered_map<int, int64_t> seqs;
std::map<std::tuple<int, int, int>, int64_t> p2p_seqs;
std::vector<Rec> done;
std::unordered_map<int64_t, Rec> inflight;
std::unordered_map<int64_t, std::unique_ptr<DeviceTimer>> timers;  // by token, ops in flight
std::deque<Pending> device_pending;  // host-complete, waiting for their device end
int64_t device_timeout_ns = 300'000'000'000;  // then a record keeps its host duration
std::vector<std::pair<int64_t, std::string>> errors;
std::atomic<int64_t> step_now{-1};
std::atomic<int64_t> next_token{1};
std::atomic<bool> enabled{true};
uint64_t threshold = 1ull << 32;  // sampling: keep when hash < threshold
uint64_t op_mask = ~0ull;          // op codes to time
std::unique_ptr<torch::Library> lib;          // kernels at BackendSelect
std::unique_ptr<torch::Library> autograd_lib; // unboxed autograd passthroughs

// completion by polling, for works without a future (gloo send/recv)
std::mutex poll_mu;
std::condition_variable poll_cv;
std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> polled;
std::unordered_map<const c10d::Work*, int64_t> polled_token;  // works still polled -> token
bool poller_started = false;
pthread_t poller_thread{};  // valid once poller_started (for its CPU clock)
// Poll period (µs): from min after progress, doubling to max while nothing completes. With the
// Python Work.wait hook on (set_poll_interval), works waited on from Python end when their wait
// returns and the poller is only a safety net for works nobody waits on.
std::atomic<int64_t> poll_min_us{100};
std::atomic<int64_t> poll_max_us{1000};

// Works that complete only in their caller's wait (gloo's reduce_scatter: a LambdaWork whose
// wait() copies the result into the output, so meshprof must never call it): the work (held,
// so its address stays its own), its token and its outputs' data pointers, by work; the work by
// output data pointer, for _c10d_functional::wait_tensor; oldest first for the cap. Guarded by
// poll_mu.
struct CallerWait {
  c10::intrusive_ptr<c10d::Work> work;
  int64_t token;
  std::vector<const void*> outputs;
};
std::unordered_map<const c10d::Work*, CallerWait> caller_waits;
std::unordered_map<const void*, const c10d::Work*> caller_by_output;
std::deque<const c10d::Work*> caller_order;
std::atomic<size_t> caller_count{0};
constexpr size_t kCallerWaitsCap = 4096;  // past it the oldest is forgotten unrecorded

thread_local int comp_depth = 0;
thread_local int64_t comp_in = 0, comp_out = 0, comp_n = 0;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void resolve_device() { meshprof_device::resolve(device_pending, done, now_ns(), device_timeout_ns); }

// Records waiting in `done` for a drain: past backlog_cap the drainer thread (Python, asleep in
// wait_backlog() without the GIL) is woken to move them into the event log, so a process that
// never reads its recorder keeps a bounded backlog instead of ~80 B per collective forever.
std::condition_variable backlog_cv;  // with mu
size_t backlog_cap = 65536;
bool backlog_stop = false;  // mu held

inline void pushed() {  // mu held, after a push into `done`
  if (done.size() >= backlog_cap) backlog_cv.notify_one();
}

int recv_any_op = -1;  // op code of recv_any_source_ (set by configure)

// A recv from any source learns its sender at completion: that peer (group-local, as for a
// named recv) and the next seq of the (sender -> this rank) direction, so it pairs with the send.
void resolve_any_source(Rec& r, c10d::Work* work) {  // mu held
  int src = -1;
  try {
    src = work->sourceRank();
  } catch (...) {
    return;
  }
  if (src < 0) return;
  r.peer = src;
  r.seq = p2p_seqs[std::make_tuple(static_cast<int>(r.group), src, 2)]++;
}

// The host saw the op end at `end` (err: its error). on_work_stream: the current stream is
// ordered after the work (see DeviceTimer::host_done). A device-timed op waits in device_pending.
void complete(int64_t token, int64_t end, const std::string* err, c10d::Work* work = nullptr,
              bool on_work_stream = false) {
  std::lock_guard<std::mutex> g(mu);
  auto it = inflight.find(token);
  if (it == inflight.end()) return;
  Rec r = it->second;
  inflight.erase(it);
  if (work != nullptr && err == nullptr && r.peer < 0 && r.op == recv_any_op) {
    resolve_any_source(r, work);
  }
  if (!timers.empty()) {
    auto tt = timers.find(token);
    if (tt != timers.end()) {
      std::unique_ptr<DeviceTimer> timer = std::move(tt->second);
      timers.erase(tt);
      bool waits = false;
      try {
        waits = err == nullptr && timer->host_done(on_work_stream);
      } catch (...) {
      }
      if (waits) {
        r.host_dur = end - r.t0;
        device_pending.push_back(Pending{r, std::move(timer), end});
        return;
      }
    }
  }
  r.dur = end - r.t0;
  if (err != nullptr) {
    r.status = 1;
    errors.emplace_back(token, *err);
  }
  done.push_back(r);
  pushed();
}

// One pass over the polled works: those that have finished complete now. Run by the poller
// thread and, through sweep(), by a reader before it drains (so a read misses no finished op).
// Each work is held by one pass at a time: a pass takes the whole list and puts back the rest.
std::mutex sweep_mu;  // one pass at a time, so a reader never misses works a pass holds

bool sweep_once(std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> items) {
    bool progressed = false;
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> keep;
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> finished;
    for (auto& it : items) {
      bool completed = true;
      try {
        completed = it.first->isCompleted();
      } catch (...) {
      }
      if (completed) {
        finished.push_back(std::move(it));
        progressed = true;
      } else {
        keep.push_back(std::move(it));
      }
    }
    const int64_t end = now_ns();
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> mine;  // no wait() came first
    {
      std::lock_guard<std::mutex> g(poll_mu);
      for (auto& it : keep) {  // a work whose wait() already returned is dropped
        if (polled_token.count(it.first.get())) polled.push_back(std::move(it));
      }
      for (auto& it : finished) {
        auto pt = polled_token.find(it.first.get());
        if (pt != polled_token.end() && pt->second == it.second) {
          polled_token.erase(pt);
          mine.push_back(std::move(it));
        }
      }
    }
    for (auto& it : mine) complete(it.second, end, nullptr, it.first.get());
    return progressed;
}

void poll_loop() {
  int64_t delay_us = poll_min_us.load();
  while (true) {
    std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> items;
    {
      std::unique_lock<std::mutex> g(poll_mu);
      if (polled.empty()) {
        poll_cv.wait(g, [] { return !polled.empty(); });
        delay_us = poll_min_us.load();
      }
    }
    bool progressed = false;
    {
      std::lock_guard<std::mutex> s(sweep_mu);  // a reader's sweep waits for this pass
      {
        std::lock_guard<std::mutex> g(poll_mu);
        items.swap(polled);
      }
      progressed = sweep_once(std::move(items));
    }
    delay_us = progressed ? poll_min_us.load()
                          : std::min<int64_t>(delay_us * 2, poll_max_us.load());
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
  }
}

// Futures whose completion callback has not run yet, by token. A future is marked complete
// (waking whoever waits on it, e.g. DDP's reducer) before its callbacks run, so a reader's sweep
// completes such ops itself (complete() is idempotent per token: the later callback is a no-op).
// A device-timed op is left to its callback: the callback runs on a stream ordered after the
// work, where its device end is marked (a reader's thread is not).
std::mutex fut_mu;
std::unordered_map<int64_t, c10::intrusive_ptr<c10::ivalue::Future>> futures_by_token;
std::unordered_set<int64_t> device_tokens;  // guarded by fut_mu

// A reader's pass (CommProfiler.flush): without waiting, on the caller's thread.
void sweep() {
  std::vector<std::pair<int64_t, std::string>> finished;  // token, error ("" if none)
  bool any_error = false;
  {
    std::lock_guard<std::mutex> g(fut_mu);
    for (auto it = futures_by_token.begin(); it != futures_by_token.end();) {
      if (it->second->completed() && device_tokens.count(it->first) == 0) {
        const bool err = it->second->hasError();
        finished.emplace_back(it->first, err ? it->second->tryRetrieveErrorMessage() : "");
        any_error = any_error || err;
        it = futures_by_token.erase(it);
      } else {
        ++it;
      }
    }
  }
  const int64_t end = now_ns();
  for (auto& f : finished) complete(f.first, end, f.second.empty() ? nullptr : &f.second);
  std::lock_guard<std::mutex> s(sweep_mu);
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, int64_t>> items;
  {
    std::lock_guard<std::mutex> g(poll_mu);
    if (polled.empty()) return;
    items.swap(polled);
  }
  sweep_once(std::move(items));
}

// Work classes whose getFuture() throws (gloo's SendWork/RecvWork): asking again would cost a
// c10::Error with its backtrace, tens of µs per op, so each class is asked once.
std::mutex no_future_mu;
std::unordered_set<std::type_index> no_future_types;

// An op in flight forgotten unrecorded (its completion can no longer be observed).
void forget(int64_t token) {
  std::lock_guard<std::mutex> g(mu);
  inflight.erase(token);
  timers.erase(token);
}

void drop_caller_wait(std::unordered_map<const c10d::Work*, CallerWait>::iterator it) {  // poll_mu held
  for (const void* p : it->second.outputs) {
    auto o = caller_by_output.find(p);
    if (o != caller_by_output.end() && o->second == it->first) caller_by_output.erase(o);
  }
  caller_waits.erase(it);
  caller_count.store(caller_waits.size());
}

// The work's op completes when its caller waits on it (waited_ptr: Work.wait in Python, or
// wait_tensor on one of its outputs); at most kCallerWaitsCap such ops are kept.
void await_caller(const c10::intrusive_ptr<c10d::Work>& work, int64_t token,
                  const std::vector<const void*>& outputs) {
  std::vector<int64_t> evicted;
  {
    std::lock_guard<std::mutex> g(poll_mu);
    caller_waits[work.get()] = CallerWait{work, token, outputs};
    for (const void* p : outputs) caller_by_output[p] = work.get();
    caller_order.push_back(work.get());
    while (caller_waits.size() > kCallerWaitsCap && !caller_order.empty()) {
      auto it = caller_waits.find(caller_order.front());
      caller_order.pop_front();
      if (it == caller_waits.end()) continue;
      evicted.push_back(it->second.token);
      drop_caller_wait(it);
    }
    while (caller_order.size() > 2 * kCallerWaitsCap) caller_order.pop_front();
    caller_count.store(caller_waits.size());
  }
  for (int64_t t : evicted) forget(t);
}

void watch(const c10::intrusive_ptr<c10d::Work>& work, int64_t token, bool wait_thread, bool device,
           const std::vector<const void*>& outputs) {
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  const std::type_info& kind = typeid(*work);
  // the last Work class seen with a future, per thread: asked without the lock
  thread_local const std::type_info* with_future = nullptr;
  bool ask = with_future != nullptr && *with_future == kind;
  if (!ask) {
    std::lock_guard<std::mutex> g(no_future_mu);
    ask = no_future_types.count(std::type_index(kind)) == 0;
  }
  if (ask) {
    try {
      fut = work->getFuture();
      if (fut) with_future = &kind;
    } catch (...) {
      fut.reset();
      std::lock_guard<std::mutex> g(no_future_mu);
      no_future_types.insert(std::type_index(kind));
    }
  }
  if (fut && !device && fut->completed()) {  // done at issue (fake backend, sync ops): end now
    if (fut->hasError()) {
      std::string msg = fut->tryRetrieveErrorMessage();
      complete(token, now_ns(), &msg);
    } else {
      complete(token, now_ns(), nullptr, nullptr, true);
    }
    return;
  }
  if (fut) {
    {
      std::lock_guard<std::mutex> g(fut_mu);
      futures_by_token[token] = fut;
      if (device) device_tokens.insert(token);
    }
    // a CUDA future runs its callbacks with current streams that wait for the work
    fut->addCallback([token, device](c10::ivalue::Future& f) {
      int64_t end = now_ns();
      if (f.hasError()) {
        std::string msg = f.tryRetrieveErrorMessage();
        complete(token, end, &msg);
      } else {
        complete(token, end, nullptr, nullptr, true);
      }
      // only now: until the record is complete a reader's sweep must still find the future
      std::lock_guard<std::mutex> g(fut_mu);
      futures_by_token.erase(token);
      if (device) device_tokens.erase(token);
    });
    return;
  }
  if (wait_thread) {  // gloo's reduce_scatter: no future, never isCompleted(); see CallerWait
    await_caller(work, token, outputs);
    return;
  }
  std::lock_guard<std::mutex> g(poll_mu);
  polled_token[work.get()] = token;
  polled.emplace_back(work, token);
  if (!poller_started) {
    poller_started = true;
    std::thread t(poll_loop);
    poller_thread = t.native_handle();
    t.detach();
  }
  poll_cv.notify_one();
}

int group_by_name(const std::string& name) {  // mu held
  auto it = gid_by_name.find(name);
  if (it != gid_by_name.end()) return it->second;
  int id = static_cast<int>(group_names.size());
  group_names.push_back(name);
  group_crc.push_back(crc32(name));
  gid_by_name.emplace(name, id);
  return id;
}

int group_of(const c10d::ProcessGroup* pg) {  // mu held
  auto it = group_ids.find(pg);
  if (it != group_ids.end()) return it->second;
  int id = group_by_name(pg->getGroupName());
  group_ids.emplace(pg, id);
  return id;
}

// The C++ object a custom-class argument holds (the schema fixes its class: a ProcessGroup
// argument, a Work return), without IValue::toCustomClass's type check, which copies the
// class type's shared_ptr (two atomic ops) on every call.
template <typename T>
const T* held(const c10::IValue& v) {
  return static_cast<const T*>(v.toObjectRef().getSlot(0).toCapsule().get());
}

// What the recorder reads of an op's arguments (the typed and the boxed kernel alike).
struct Issue {
  const c10d::ProcessGroup* pg = nullptr;
  int64_t in_b = 0;   // bytes of the input tensors
  int64_t out_b = 0;  // bytes of the output tensors
  int16_t dtype = -1;
  int peer = -1;      // peer's group rank (send/recv), -1
  bool async = true;
};

// Before the op is issued: inside a composite (object collective, custom label) it is counted
// there; otherwise it takes its (group, seq) and, when timed and sampled, opens its record in
// `inflight` (r: the record, its start time taken in the same lock as the seq). Returns whether
// a record was opened. May throw: the caller then runs the op unrecorded.
bool begin(const Spec& spec, const Issue& a, Rec& r) {
  if (comp_depth > 0) {
    comp_in += a.in_b;
    comp_out += a.out_b;
    comp_n += 1;
    return false;
  }
  if (a.pg == nullptr) return false;
  std::lock_guard<std::mutex> g(mu);
  int gid = group_of(a.pg);
  int64_t seq;
  if (spec.p2p) {
    auto key = std::make_tuple(gid, a.peer, spec.p2p);
    seq = p2p_seqs[key]++;
  } else {
    seq = seqs[gid]++;
  }
  r.op = static_cast<uint8_t>(spec.op_code);
  r.group = static_cast<uint16_t>(gid);
  r.peer = a.peer;
  r.seq = seq;
  r.in_bytes = a.in_b;
  r.out_bytes = a.out_b;
  r.dtype = a.dtype;
  r.flags = a.async ? kAsync : 0;
  r.step = step_now.load(std::memory_order_relaxed);
  r.dur = -1;
  r.host_dur = -1;
  bool timed = ((op_mask >> spec.op_code) & 1ull) != 0;
  uint64_t h = ((static_cast<uint64_t>(seq) * 2654435761ull) ^ group_crc[gid]) & 0xFFFFFFFFull;
  if (timed && h < threshold) {
    r.sampled = 1;
    r.token = next_token.fetch_add(1, std::memory_order_relaxed);
    r.t0 = now_ns();
    inflight.emplace(r.token, r);
    return true;
  }
  if (timed) {
    r.sampled = 0;  // counted only
    done.push_back(r);
    pushed();
  }
  return false;
}

// A device timer for the op about to be issued (its first tensor `first`), marked last, right
// before the op is issued. Returns whether the op is device-timed.
bool start_device(const Rec& r, const at::Tensor* first) {
  if (!(script.on || (meshprof_device::kWithCuda && meshprof_device::device_timing.load()))) {
    return false;
  }
  std::lock_guard<std::mutex> g(mu);
  try {
    auto timer = meshprof_device::make_timer(first, r.group);
    if (timer) return timers.emplace(r.token, std::move(timer)).second;
  } catch (...) {
  }
  return false;
}

// The op raised: its record ends with the error (the caller rethrows).
void failed(const Rec& r, const std::exception& e) {
  try {
    std::string msg = e.what();
    complete(r.token, now_ns(), &msg);
  } catch (...) {
  }
}

// The op was issued and returned `work` (nullptr: a synchronous op, ended now): its completion
// is watched (future callback, poller or wait thread). Never throws.
void issued(const Spec& spec, const Rec& r, bool device, const c10::intrusive_ptr<c10d::Work>* work,
            const std::vector<const void*>& outputs) {
  try {
    if (work != nullptr && work->defined()) {
      if (device) {
        std::lock_guard<std::mutex> g(mu);
        auto tt = timers.find(r.token);
        if (tt != timers.end()) tt->second->attach(*work);
      }
      watch(*work, r.token, spec.wait_thread != 0, device, outputs);
    } else {
      // no work: a synchronous op (monitored_barrier; NCCL with async_op=False since torch 2.7,
      // ordered on the current stream), so an end marked on the current stream now follows it
      complete(r.token, now_ns(), nullptr, nullptr, device);
    }
  } catch (...) {
    try {
      complete(r.token, now_ns(), nullptr);
    } catch (...) {
    }
  }
}

// The boxed kernel: any c10d op whose typed kernel could not be registered (a signature this
// build does not know). Its arguments are read from the IValue stack.
void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto below = ks.remove(c10::DispatchKey::BackendSelect);
  if (!enabled.load(std::memory_order_relaxed)) {
    op.redispatchBoxed(below, stack);
    return;
  }
  const Spec* spec = nullptr;
  Rec r{};
  bool record = false;
  at::Tensor first;
  std::vector<const void*> outputs;  // caller-completed ops: their outputs' data pointers
  try {
    auto it = specs.find(op.schema().name());
    if (it != specs.end()) spec = &it->second;
    if (spec != nullptr) {
      const size_t n = op.schema().arguments().size();
      const size_t base = stack->size() - n;
      auto arg = [&](int i) -> const c10::IValue& { return (*stack)[base + i]; };
      Issue a;
      a.in_b = spec->in_arg >= 0 ? bytes_of(arg(spec->in_arg)) : 0;
      a.out_b = spec->out_arg >= 0 ? bytes_of(arg(spec->out_arg)) : 0;
      if (comp_depth == 0) {
        a.pg = held<c10d::ProcessGroup>(arg(spec->pg_arg));
        a.peer = spec->peer_arg >= 0 ? static_cast<int>(arg(spec->peer_arg).toInt()) : -1;
        a.dtype = dtype_of(arg(spec->tensor_arg));
        a.async = spec->async_arg < 0 || arg(spec->async_arg).toBool();
      }
      record = begin(*spec, a, r);
      if (record && (script.on || meshprof_device::kWithCuda)) {
        first = meshprof_device::first_tensor_of(arg(spec->tensor_arg));
      }
      if (record && spec->wait_thread && spec->out_arg >= 0) {
        meshprof_args::ptrs_of(arg(spec->out_arg), outputs);
      }
    }
  } catch (...) {
    record = false;  // never break training: run the op unrecorded
  }
  const bool device = record && start_device(r, first.defined() ? &first : nullptr);
  try {
    op.redispatchBoxed(below, stack);
  } catch (const std::exception& e) {
    if (record) failed(r, e);
    throw;
  }
  if (!record) return;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    const c10::IValue* w = stack->empty() ? nullptr : &stack->back();
    if (w != nullptr && w->isCustomClass()) {
      work = c10::static_intrusive_pointer_cast<c10d::Work>(w->toObjectRef().getSlot(0).toCapsule());
    }
  } catch (...) {
  }
  issued(*spec, r, device, work ? &work : nullptr, outputs);
}

// -- typed kernels ------------------------------------------------------------------------------
// The ops PyTorch calls with a typed handle (ProcessGroup.hpp: op.call with these exact C++
// signatures) get a typed kernel: the dispatcher calls it with the C++ arguments, without
// boxing them into an IValue stack (a List per tensor list, an Object per ProcessGroup and
// Work) and unboxing the result, and it redispatches typed. An op whose signature differs in
// the running torch build keeps the boxed kernel (registration checks the signature first).

using PG = c10::intrusive_ptr<c10d::ProcessGroup>;
using RO = c10::intrusive_ptr<c10d::ReduceOp>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorVec = std::vector<at::Tensor>;
using TensorVecs = std::vector<std::vector<at::Tensor>>;

constexpr int kSlots = 20;
Spec slot_spec[kSlots];          // by slot: the op's row of ops.py's table
std::atomic<bool> slot_known[kSlots];  // configure() gave the slot a row
const char* const kSlotNames[kSlots] = {
    "allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_",
    "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_",
    "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "broadcast_", "reduce_",
    "gather_", "scatter_", "alltoall_", "alltoall_base_", "barrier", "monitored_barrier_",
    "send", "recv_", "recv_any_source_"};

int slot_of(const std::string& name) {
  for (int i = 0; i < kSlots; ++i)
    if (name == kSlotNames[i]) return i;
  return -1;
}

std::vector<int> autograd_slots;  // ops with the unboxed autograd passthrough

template <typename R>
const WorkPtr* work_of(const R& out) {
  if constexpr (std::is_same_v<R, WorkPtr>) {
    return &out;
  } else {
    return &std::get<1>(out);  // (outputs, work)
  }
}

template <int Slot, typename Sig>
struct Typed;

template <int Slot, typename Ret, typename... Args>
struct Typed<Slot, Ret(Args...)> {
  static inline std::optional<c10::TypedOperatorHandle<Ret(Args...)>> op;

  static Ret fn(c10::DispatchKeySet ks, Args... args) {
    const auto below = ks.remove(c10::DispatchKey::BackendSelect);
    if (!enabled.load(std::memory_order_relaxed) || !slot_known[Slot].load(std::memory_order_relaxed)) {
      return op->redispatch(below, std::forward<Args>(args)...);
    }
    const Spec& spec = slot_spec[Slot];
    Rec r{};
    bool record = false;
    const at::Tensor* first = nullptr;
    std::vector<const void*> outputs;  // caller-completed ops: their outputs' data pointers
    try {
      using namespace meshprof_args;
      Issue a;
      visit_arg(spec.in_arg, [&](const auto& v) { a.in_b = typed_bytes(v); }, args...);
      visit_arg(spec.out_arg, [&](const auto& v) { a.out_b = typed_bytes(v); }, args...);
      if (comp_depth == 0) {
        visit_arg(spec.tensor_arg, [&](const auto& v) { first = typed_first(v); }, args...);
        a.dtype = first != nullptr ? static_cast<int16_t>(first->scalar_type()) : -1;
        visit_arg(spec.pg_arg, [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, PG>) a.pg = v.get();
        }, args...);
        visit_arg(spec.peer_arg, [&](const auto& v) { a.peer = static_cast<int>(typed_int(v, -1)); }, args...);
        visit_arg(spec.async_arg, [&](const auto& v) { a.async = typed_int(v, 1) != 0; }, args...);
      }
      record = begin(spec, a, r);
      if (record && spec.wait_thread) {
        visit_arg(spec.out_arg, [&](const auto& v) { typed_ptrs(v, outputs); }, args...);
      }
    } catch (...) {
      record = false;  // never break training: run the op unrecorded
    }
    const bool device = record && start_device(r, first);
    if constexpr (std::is_void_v<Ret>) {
      try {
        op->redispatch(below, std::forward<Args>(args)...);
      } catch (const std::exception& e) {
        if (record) failed(r, e);
        throw;
      }
      if (record) issued(spec, r, device, nullptr, outputs);
    } else {
      Ret out = [&]() -> Ret {
        try {
          return op->redispatch(below, std::forward<Args>(args)...);
        } catch (const std::exception& e) {
          if (record) failed(r, e);
          throw;
        }
      }();
      if (record) issued(spec, r, device, work_of(out), outputs);
      return out;
    }
  }

  // The autograd key. PyTorch has no autograd kernel for the c10d ops: its autograd fallback
  // (a boxed kernel) runs, so every call is boxed into an IValue stack there (a List per tensor
  // list, an Object per ProcessGroup), unboxed for the backend and its result boxed and unboxed
  // again -- whether meshprof is installed or not. With no tensor argument requiring grad that
  // fallback only redispatches below autograd (torch/csrc/autograd/
  // autograd_not_implemented_fallback.cpp, either fallback mode), which this does without
  // boxing; otherwise it runs the fallback itself on a boxed stack (its warning hooks on the
  // outputs). Nothing is recorded here: the BackendSelect kernel records, as before.
  static inline std::optional<c10::OperatorHandle> handle;

  static void fallback(const c10::OperatorHandle& h, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    if (!at::impl::HasVariableHooks()) {
      h.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
      return;
    }
    at::impl::GetVariableHooks()->basic_autograd_not_implemented_fallback(h, ks, stack);
  }

  static Ret autograd_fn(c10::DispatchKeySet ks, Args... args) {
    bool grad = false;
    meshprof_args::visit_all([&](const auto& v) { grad = grad || meshprof_args::typed_requires_grad(v); },
                             args...);
    if (!grad) return op->redispatch(ks & c10::after_autograd_keyset, std::forward<Args>(args)...);
    return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(
        c10::BoxedKernel::makeFromFunction<&fallback>(), *handle, ks, std::forward<Args>(args)...);
  }

  // Registers fn for `name` in `lib` when the op's kernels were registered with exactly this
  // signature; false (nothing registered) otherwise. Then the autograd passthrough in
  // `autograd` (when not null) where the op has no autograd kernel of its own.
  static bool install(torch::Library& lib, torch::Library* autograd) {
    const char* name = kSlotNames[Slot];
    std::optional<c10::OperatorHandle> h;
    try {
      h = c10::Dispatcher::singleton().findOp(c10::OperatorName(std::string("c10d::") + name, ""));
      if (!h.has_value() || !h->hasKernelForDispatchKey(c10::DispatchKey::CPU)) return false;
      op.emplace(h->template typed<Ret(Args...)>());  // throws if torch's kernels differ
      lib.impl(name, torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(fn)));
    } catch (...) {
      return false;
    }
    if (autograd == nullptr) return true;
    try {
      const bool own = h->hasKernelForDispatchKey(c10::DispatchKey::Autograd) ||
                       h->hasKernelForAnyDispatchKey(c10::autograd_dispatch_keyset) ||
                       h->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
                       h->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
      if (!own) {
        handle.emplace(*h);
        autograd->impl(name, torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(autograd_fn)));
        autograd_slots.push_back(Slot);
      }
    } catch (...) {
    }
    return true;
  }
};

// slot -> its typed kernel, with the signature ProcessGroup.hpp calls the op with
bool install_typed(int slot, torch::Library& lib, torch::Library* autograd) {
  switch (slot) {
    case 0: return Typed<0, std::tuple<TensorVec, WorkPtr>(at::TensorList, const PG&, const RO&, const std::optional<at::Tensor>&, bool, int64_t)>::install(lib, autograd);
    case 1: return Typed<1, WorkPtr(at::TensorList, const PG&, const RO&, bool, int64_t)>::install(lib, autograd);
    case 2: return Typed<2, std::tuple<TensorVecs, WorkPtr>(const TensorVecs&, at::TensorList, const PG&, bool, int64_t)>::install(lib, autograd);
    case 3: return Typed<3, std::tuple<at::Tensor, WorkPtr>(at::Tensor&, at::Tensor&, const PG&, bool, int64_t)>::install(lib, autograd);
    case 4: return Typed<4, WorkPtr(const TensorVecs&, const at::TensorList&, const PG&, bool)>::install(lib, autograd);
    case 5: return Typed<5, WorkPtr(const at::TensorList, const at::TensorList, const PG&, bool)>::install(lib, autograd);
    case 6: return Typed<6, std::tuple<TensorVec, WorkPtr>(const at::TensorList&, const TensorVecs&, const PG&, const RO&, bool, int64_t)>::install(lib, autograd);
    case 7: return Typed<7, std::tuple<at::Tensor, WorkPtr>(at::Tensor&, at::Tensor&, const PG&, const RO&, bool, int64_t)>::install(lib, autograd);
    case 8: return Typed<8, WorkPtr(const at::TensorList, const at::TensorList, const PG&, const RO&, bool, int64_t)>::install(lib, autograd);
    case 9: return Typed<9, std::tuple<TensorVec, WorkPtr>(at::TensorList, const PG&, int64_t, int64_t, bool, int64_t)>::install(lib, autograd);
    case 10: return Typed<10, WorkPtr(at::TensorList, const PG&, const RO&, int64_t, int64_t, bool, int64_t)>::install(lib, autograd);
    case 11: return Typed<11, WorkPtr(const TensorVecs&, const at::TensorList&, const PG&, int64_t, bool, int64_t)>::install(lib, autograd);
    case 12: return Typed<12, std::tuple<TensorVec, WorkPtr>(const at::TensorList&, const TensorVecs&, const PG&, int64_t, bool, int64_t)>::install(lib, autograd);
    case 13: return Typed<13, std::tuple<TensorVec, WorkPtr>(const at::TensorList&, const at::TensorList&, const PG&, bool, int64_t)>::install(lib, autograd);
    case 14: return Typed<14, WorkPtr(at::Tensor&, at::Tensor&, const PG&, std::vector<int64_t>, std::vector<int64_t>, bool, int64_t)>::install(lib, autograd);
    case 15: return Typed<15, WorkPtr(at::Tensor, const PG&, const std::vector<int64_t>&, bool, int64_t)>::install(lib, autograd);
    case 16: return Typed<16, void(at::Tensor, const PG&, const std::vector<int64_t>&, int64_t, bool)>::install(lib, autograd);
    case 17: return Typed<17, WorkPtr(at::TensorList, const PG&, int64_t, int64_t)>::install(lib, autograd);
    case 18: return Typed<18, WorkPtr(at::TensorList, const PG&, int64_t, int64_t)>::install(lib, autograd);
    case 19: return Typed<19, WorkPtr(at::TensorList, const PG&, int64_t)>::install(lib, autograd);
    default: return false;
  }
}

std::vector<std::string> typed_names;  // ops installed with a typed kernel

}  // namespace

void configure(const std::vector<std::tuple<std::string, int, int, int, int, int, int, int, int, int>>& table,
               int64_t sample_threshold, int64_t mask) {
  std::lock_guard<std::mutex> g(mu);
  specs.clear();
  for (auto& k : slot_known) k.store(false);
  for (const auto& t : table) {
    Spec s{std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t), std::get<5>(t),
           std::get<6>(t), std::get<7>(t), std::get<8>(t), std::get<9>(t)};
    specs["c10d::" + std::get<0>(t)] = s;
    const int slot = slot_of(std::get<0>(t));
    if (slot >= 0) {
      slot_spec[slot] = s;
      slot_known[slot].store(true);
    }
    if (std::get<0>(t) == "recv_any_source_") recv_any_op = std::get<1>(t);
  }
  threshold = static_cast<uint64_t>(sample_threshold);
  op_mask = static_cast<uint64_t>(mask);
}

bool waited_ptr(c10d::Work* ptr, int64_t end, const std::string& err);

// _c10d_functional::wait_tensor at BackendSelect: the op runs unchanged (the caller's wait), then
// a caller-completed op writing this tensor (a functional reduce_scatter on gloo) ends now.
std::optional<c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)>> wait_tensor_op;
std::unique_ptr<torch::Library> wait_lib;

at::Tensor wait_tensor_hook(c10::DispatchKeySet ks, const at::Tensor& t) {
  at::Tensor out = wait_tensor_op->redispatch(ks.remove(c10::DispatchKey::BackendSelect), t);
  if (caller_count.load(std::memory_order_relaxed) == 0) return out;
  try {
    if (!t.defined() || !t.has_storage()) return out;
    const void* p = t.const_data_ptr();
    c10d::Work* work = nullptr;
    {
      std::lock_guard<std::mutex> g(poll_mu);
      auto it = caller_by_output.find(p);
      if (it != caller_by_output.end()) work = const_cast<c10d::Work*>(it->second);
    }
    if (work != nullptr) waited_ptr(work, now_ns(), std::string());
  } catch (...) {
  }
  return out;
}

// Installs the wait_tensor hook (false: this build has no functional collectives).
bool install_wait_tensor() {
  try {
    auto h = c10::Dispatcher::singleton().findOp(c10::OperatorName("_c10d_functional::wait_tensor", ""));
    if (!h.has_value()) return false;
    wait_tensor_op.emplace(h->typed<at::Tensor(const at::Tensor&)>());
    wait_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "_c10d_functional",
                                                std::make_optional(c10::DispatchKey::BackendSelect),
                                                __FILE__, __LINE__);
    wait_lib->impl("wait_tensor", torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(wait_tensor_hook)));
    return true;
  } catch (...) {
    wait_lib.reset();
    return false;
  }
}

// Installs a kernel for each op: typed where its signature is known (typed=True), else boxed;
// with autograd=True, typed ops also get the unboxed autograd passthrough.
void install(const std::vector<std::string>& names, bool typed, bool autograd) {
  lib = std::make_unique<torch::Library>(torch::Library::IMPL, "c10d",
                                         std::make_optional(c10::DispatchKey::BackendSelect), __FILE__, __LINE__);
  if (typed && autograd) {
    autograd_lib = std::make_unique<torch::Library>(
        torch::Library::IMPL, "c10d", std::make_optional(c10::DispatchKey::Autograd), __FILE__, __LINE__);
  }
  typed_names.clear();
  autograd_slots.clear();
  {
    std::lock_guard<std::mutex> g(mu);
    backlog_stop = false;
  }
  for (const auto& n : names) {
    const int slot = slot_of(n);
    if (typed && slot >= 0 && install_typed(slot, *lib, autograd_lib.get())) {
      typed_names.push_back(n);
      continue;
    }
    lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  }
  install_wait_tensor();
}

std::vector<std::string> typed_ops() { return typed_names; }

std::vector<std::string> autograd_ops() {
  std::vector<std::string> out;
  for (int slot : autograd_slots) out.emplace_back(kSlotNames[slot]);
  return out;
}

void uninstall() {
  wait_lib.reset();
  autograd_lib.reset();
  lib.reset();
  autograd_slots.clear();
}

void set_enabled(bool on) { enabled.store(on); }

void set_step(int64_t s) { step_now.store(s); }

// (records as bytes, group names, errors by token, pending records as bytes). With `pending`,
// the ops not finished yet (in flight, or host-complete and waiting for their device end) are
// copied in the same hold of `mu` as the finished records are taken: a read that takes both sees
// every op exactly once, finished or pending (an op ends between two drains, never inside one).
std::tuple<py::bytes, std::vector<std::string>, std::vector<std::pair<int64_t, std::string>>, py::bytes>
drain(bool pending) {
  std::vector<Rec> out;
  std::vector<Rec> open;
  std::vector<std::pair<int64_t, std::string>> errs;
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> g(mu);
    resolve_device();
    out.swap(done);
    errs.swap(errors);
    names = group_names;
    if (pending) {
      open.reserve(inflight.size() + device_pending.size());
      for (const auto& kv : inflight) open.push_back(kv.second);
      for (const auto& p : device_pending) open.push_back(p.rec);
    }
  }
  return {py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(Rec)), names, errs,
          py::bytes(reinterpret_cast<const char*>(open.data()), open.size() * sizeof(Rec))};
}

py::bytes inflight_records() {
  std::vector<Rec> out;
  {
    std::lock_guard<std::mutex> g(mu);
    for (const auto& kv : inflight) out.push_back(kv.second);
  }
  return py::bytes(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(Rec));
}

std::vector<std::string> names_of_groups() {
  std::lock_guard<std::mutex> g(mu);
  return group_names;
}

// Python's Work.wait() on this work returned (err: what it raised, "" if nothing): a polled
// op ends now, as its caller saw it. Returns whether the work was one the poller was watching.
bool waited_ptr(c10d::Work* ptr, int64_t end, const std::string& err) {
  int64_t token = -1;
  {
    std::lock_guard<std::mutex> g(poll_mu);
    auto it = polled_token.find(ptr);
    if (it != polled_token.end()) {
      token = it->second;
      polled_token.erase(it);
    } else {
      auto cw = caller_waits.find(ptr);
      if (cw == caller_waits.end()) return false;
      token = cw->second.token;
      drop_caller_wait(cw);
    }
  }
  complete(token, end, err.empty() ? nullptr : &err, ptr, true);  // the caller's stream waited
  return true;
}

bool work_waited(py::handle work, const std::string& err) {
  const int64_t end = now_ns();
  c10d::Work* ptr = nullptr;
  try {
    ptr = py::cast<c10d::Work*>(work);
  } catch (...) {
    return false;
  }
  return waited_ptr(ptr, end, err);
}

// Work.wait as meshprof installs it on the pybind classes (Work, FakeWork, ...): the work's own
// (virtual) wait, without the GIL as torch binds it, then work_waited — in C++, so a wait costs
// no Python frame. An exception is recorded on the op and raised on unchanged.
bool hooked_wait(c10d::Work& work, std::chrono::milliseconds timeout) {
  bool out = false;
  try {
    py::gil_scoped_release nogil;
    out = work.wait(timeout);
  } catch (const std::exception& e) {
    try {
      waited_ptr(&work, now_ns(), std::string(e.what()));
    } catch (...) {
    }
    throw;
  }
  try {
    waited_ptr(&work, now_ns(), std::string());
  } catch (...) {
  }
  return out;
}

// The hooked wait as a method of `cls` (set it with setattr; the original stays with Python).
py::object wait_method(py::object cls, py::object doc) {
  return py::cpp_function(&hooked_wait, py::name("wait"), py::is_method(cls),
                          py::arg("timeout") = std::chrono::milliseconds(0),
                          py::doc(doc.is_none() ? "" : py::str(doc).cast<std::string>().c_str()));
}

// CPU time (ns) of the C++ poller thread so far; 0 before it starts.
int64_t poller_cpu_ns() {
  pthread_t th;
  {
    std::lock_guard<std::mutex> g(poll_mu);
    if (!poller_started) return 0;
    th = poller_thread;
  }
  clockid_t cid;
  if (pthread_getcpuclockid(th, &cid) != 0) return -1;
  timespec ts{};
  if (clock_gettime(cid, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A new profiler numbers from 0, as the Python kernel's counters do (group ids stay).
void reset_seqs() {
  std::lock_guard<std::mutex> g(mu);
  seqs.clear();
  p2p_seqs.clear();
}

void set_poll_interval(int64_t min_us, int64_t max_us) {
  poll_min_us.store(std::max<int64_t>(min_us, 1));
  poll_max_us.store(std::max<int64_t>(max_us, min_us));
}

int64_t polled_count() {
  std::lock_guard<std::mutex> g(poll_mu);
  return static_cast<int64_t>(polled_token.size());
}

int64_t record_size() { return static_cast<int64_t>(sizeof(Rec)); }

// -- device timing ----------------------------------------------------------------------------
// Records complete on the host whose device end has not been reached yet.
int64_t device_pending_count() {
  std::lock_guard<std::mutex> g(mu);
  resolve_device();  // non-blocking queries; the resolved wait in `done` for drain()
  return static_cast<int64_t>(device_pending.size());
}

// Test hook: on, ops issued from now on take the next scripted (device ns, ready at) entry as
// their stand-in device timer (off: none, and the counters restart).
void test_device_script(bool on, const std::vector<std::pair<int64_t, int64_t>>& entries) {
  std::lock_guard<std::mutex> g(mu);
  script.on = on;
  script.entries.assign(entries.begin(), entries.end());
  if (!on) script = meshprof_device::Script{};
}

// Test hook: set the stand-in device's clock (an entry is reached once clock >= its "ready
// at"); returns (timers created, ends marked, ready queries, elapsed asked before ready).
std::tuple<int64_t, int64_t, int64_t, int64_t> test_device_clock(int64_t t) {
  std::lock_guard<std::mutex> g(mu);
  if (t >= 0) script.clock = t;
  return {script.created, script.ends, script.queries, script.early};
}

int64_t now() { return now_ns(); }

// The drainer's wait (called without the GIL): true once `done` holds backlog_cap records or
// more, false after timeout_ms or when stopped (stop_backlog).
bool wait_backlog(int64_t timeout_ms) {
  std::unique_lock<std::mutex> g(mu);
  return backlog_cv.wait_for(g, std::chrono::milliseconds(timeout_ms),
                             [] { return backlog_stop || done.size() >= backlog_cap; }) &&
         !backlog_stop;
}

void stop_backlog() {
  std::lock_guard<std::mutex> g(mu);
  backlog_stop = true;
  backlog_cv.notify_all();
}

void set_backlog_cap(int64_t n) {
  std::lock_guard<std::mutex> g(mu);
  backlog_cap = static_cast<size_t>(std::max<int64_t>(n, 1));
}

int64_t backlog() {
  std::lock_guard<std::mutex> g(mu);
  return static_cast<int64_t>(done.size());
}

// object collectives and custom labels: the inner c10d ops are counted into the composite
void composite_enter() {
  if (comp_depth++ == 0) comp_in = comp_out = comp_n = 0;
}

std::tuple<int64_t, int64_t, int64_t> composite_exit() {
  if (comp_depth > 0) --comp_depth;
  return {comp_in, comp_out, comp_n};
}

// the composite's own sequence number, from the same counters as the c10d ops of its group
int64_t next_seq(const std::string& group_name, int64_t peer, int64_t p2p) {
  std::lock_guard<std::mutex> g(mu);
  int gid = group_by_name(group_name);
  if (p2p) return p2p_seqs[std::make_tuple(gid, static_cast<int>(peer), static_cast<int>(p2p))]++;
  return seqs[gid]++;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("configure", &configure);
  m.def("install", &install, py::arg("names"), py::arg("typed") = true, py::arg("autograd") = true);
  m.def("autograd_ops", &autograd_ops);
  m.def("typed_ops", &typed_ops);
  m.def("uninstall", &uninstall);
  m.def("set_enabled", &set_enabled);
  m.def("set_step", &set_step);
  m.def("drain", &drain, py::arg("pending") = false);
  m.def("sweep", &sweep, py::call_guard<py::gil_scoped_release>());
  m.def("inflight_records", &inflight_records);
  m.def("record_size", &record_size);
  m.def("work_waited", &work_waited);
  m.def("wait_method", &wait_method);
  m.def("poller_cpu_ns", &poller_cpu_ns);
  m.def("reset_seqs", &reset_seqs);
  m.def("set_poll_interval", &set_poll_interval);
  m.def("polled_count", &polled_count);
  m.def("caller_wait_count", [] { return static_cast<int64_t>(caller_count.load()); });
  m.def("group_names", &names_of_groups);
  m.def("now", &now);
  m.def("wait_backlog", &wait_backlog, py::call_guard<py::gil_scoped_release>());
  m.def("stop_backlog", &stop_backlog);
  m.def("set_backlog_cap", &set_backlog_cap);
  m.def("backlog", &backlog);
  m.def("composite_enter", &composite_enter);
  m.def("composite_exit", &composite_exit);
  m.def("next_seq", &next_seq);
  m.def("has_cuda", [] { return meshprof_device::kWithCuda; });
  m.def("set_device_timing", [](bool on) { meshprof_device::device_timing.store(on); });
  m.def("set_device_timeout", [](int64_t ns) {
    std::lock_guard<std::mutex> g(mu);
    device_timeout_ns = ns;
  });
  m.def("device_pending_count", &device_pending_count);
  m.def("test_device_script", &test_device_script);
  m.def("test_device_clock", &test_device_clock);
}
