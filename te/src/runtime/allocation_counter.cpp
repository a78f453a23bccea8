#include <c10/core/Allocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "te/compat.h"
#include "te/error.h"
#include "te/runtime/meta.h"
#include "te/scope_stack.h"

namespace te {

struct AllocationCounter::State {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};

  void add(int64_t bytes) {
    const int64_t now = live.fetch_add(bytes) + bytes;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

namespace {

using State = AllocationCounter::State;

// The counters alive on this thread, per device type (innermost last).
ScopeStack<std::shared_ptr<State>>& active(c10::DeviceType type) {
  thread_local ScopeStack<std::shared_ptr<State>> cpu;
  thread_local ScopeStack<std::shared_ptr<State>> meta;
  return type == c10::DeviceType::Meta ? meta : cpu;
}

// What a counted allocation carries to its deleter: the wrapped allocation and whom to tell.
struct Record {
  c10::DataPtr inner;
  int64_t bytes;
  std::vector<std::shared_ptr<State>> counters;
};

void release(void* context) {
  auto* record = static_cast<Record*>(context);
  for (const auto& counter : record->counters) counter->live.fetch_sub(record->bytes);
  delete record;  // frees the wrapped allocation
}

// Counted CPU allocations by address: LibTorch's raw_allocate needs a CPU DataPtr whose context
// is its data, so the Record of one cannot ride in the context. (Meta allocations have no
// address; theirs rides in the context, and nothing allocates meta memory raw.)
struct CpuRecords {
  std::mutex mutex;
  std::unordered_map<void*, std::unique_ptr<Record>> records;
  c10::DeleterFnPtr inner_raw_deleter = nullptr;
};
CpuRecords& cpu_records() {
  static CpuRecords* records = new CpuRecords();  // never freed: storages outlive statics
  return *records;
}

void release_cpu(void* data) {
  std::unique_ptr<Record> record;
  {
    CpuRecords& r = cpu_records();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.records.find(data);
    if (it == r.records.end()) {
      if (r.inner_raw_deleter != nullptr) r.inner_raw_deleter(data);
      return;
    }
    record = std::move(it->second);
    r.records.erase(it);
  }
  for (const auto& counter : record->counters) counter->live.fetch_sub(record->bytes);
}  // the record's inner DataPtr frees the memory

// Passes every call to the allocator it wraps; an allocation made while a counter is alive on
// the allocating thread is counted, and uncounted when freed (on any thread).
class CountingAllocator final : public c10::Allocator {
 public:
  CountingAllocator(c10::DeviceType type, c10::Allocator* inner) : type_(type), inner_(inner) {}

  c10::DataPtr allocate(size_t bytes) TE_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(bytes);
    const auto& open = active(type_);
    if (open.empty()) return inner;
    std::vector<std::shared_ptr<State>> counters = open.values();
    for (const auto& counter : counters) counter->add(static_cast<int64_t>(bytes));
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto record = std::make_unique<Record>(
        Record{std::move(inner), static_cast<int64_t>(bytes), std::move(counters)});
    if (type_ == c10::DeviceType::CPU && data != nullptr) {
      CpuRecords& r = cpu_records();
      std::lock_guard<std::mutex> lock(r.mutex);
      r.records[data] = std::move(record);
      return c10::DataPtr(data, data, &release_cpu, device);
    }
    return c10::DataPtr(data, record.release(), &release, device);
  }
#if TE_ALLOCATOR_MUTABLE
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }
#endif
  c10::DeleterFnPtr raw_deleter() const override {
    return type_ == c10::DeviceType::CPU ? &release_cpu : inner_->raw_deleter();
  }

 private:
  c10::DeviceType type_;
  c10::Allocator* inner_;
};

void install(c10::DeviceType type) {
  static std::once_flag cpu_once;
  static std::once_flag meta_once;
  std::call_once(type == c10::DeviceType::Meta ? meta_once : cpu_once, [type] {
    c10::Allocator* inner = c10::GetAllocator(type);
    TE_CHECK(inner != nullptr, "AllocationCounter: this LibTorch has no allocator for ",
             c10::DeviceTypeName(type));
    if (type == c10::DeviceType::CPU) cpu_records().inner_raw_deleter = inner->raw_deleter();
    // Never freed: storages made through it may outlive every counter, and the process.
    c10::SetAllocator(type, new CountingAllocator(type, inner), /*priority=*/100);
  });
}

}  // namespace

AllocationCounter::AllocationCounter(c10::DeviceType device_type)
    : state_(std::make_shared<State>()), device_type_(device_type) {
  TE_CHECK(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::Meta,
           "AllocationCounter counts CPU or meta allocations, not ",
           c10::DeviceTypeName(device_type));
  install(device_type);
  active(device_type).push(this, state_);
}

AllocationCounter::~AllocationCounter() { active(device_type_).pop(this); }

int64_t AllocationCounter::live_bytes() const { return state_->live.load(); }
int64_t AllocationCounter::peak_bytes() const { return state_->peak.load(); }
void AllocationCounter::reset_peak() { state_->peak.store(state_->live.load()); }

}  // namespace te
