#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "internal.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/sharding/context.h"

namespace te {
namespace detail {

namespace {

// The worlds pushed on this thread, innermost last.
ScopeStack<std::shared_ptr<World>>& thread_worlds() {
  thread_local ScopeStack<std::shared_ptr<World>> stack;
  return stack;
}

// A peer that closes its sockets must surface as an error from the collective, not kill this
// process with SIGPIPE on the next write. Only the default disposition is replaced: a handler
// the program installed stays.
void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

}  // namespace

ProcessWorld& process_world() {
  static ProcessWorld pw;
  return pw;
}

DistributedOptions with_env_overrides(DistributedOptions options) {
  if (const char* env = std::getenv("TE_DIST_TIMEOUT_S"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    const double seconds = std::strtod(env, &end);
    TE_CHECK(end != env && *end == '\0' && seconds > 0, "TE_DIST_TIMEOUT_S='", env,
             "' is not a positive number of seconds; set e.g. TE_DIST_TIMEOUT_S=60");
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  if (const char* env = std::getenv("TE_CHECK_COLLECTIVES"); env != nullptr && *env != '\0') {
    const std::string v = env;
    TE_CHECK(v == "0" || v == "1", "TE_CHECK_COLLECTIVES='", v,
             "' is not 0 or 1; set TE_CHECK_COLLECTIVES=1 to compare every collective across "
             "ranks before running it");
    options.check_collectives = v == "1";
  }
  if (const char* env = std::getenv("TE_COMM_BACKEND"); env != nullptr && *env != '\0') {
    options.backend = env;
    if (options.backend != "auto") comm::find_backend(options.backend, "TE_COMM_BACKEND");
  } else if (options.backend != "auto") {
    comm::find_backend(options.backend, "DistributedOptions::backend");
  }
  return options;
}

struct World::Heartbeat {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

namespace {
constexpr auto kHeartbeatPeriod = std::chrono::milliseconds(250);
std::string key(const char* what, int64_t rank) { return std::string(what) + std::to_string(rank); }
}  // namespace

World::World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int local_rank,
             DistributedOptions options, std::string gloo_host, bool heartbeat, bool simulated)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      local_rank_(local_rank),
      options_(options),
      gloo_host_(std::move(gloo_host)),
      simulated_(simulated) {
  ignore_sigpipe();
  store_->set(key("joined/", rank_), std::vector<uint8_t>{1});
  if (!heartbeat) return;
  heartbeat_ = std::make_unique<Heartbeat>();
  heartbeat_->thread = std::thread([this, hb = heartbeat_.get()] {
    std::unique_lock<std::mutex> lock(hb->mutex);
    while (!hb->stop) {
      lock.unlock();
      try {
        store_->add(key("hb/", rank_), 1);
      } catch (const std::exception&) {
        // The store is gone (rank 0 exited): nothing left to tell.
      }
      lock.lock();
      hb->wake.wait_for(lock, kHeartbeatPeriod, [hb] { return hb->stop; });
    }
  });
}

World::~World() {
  if (!heartbeat_) return;  // thread ranks share an in-process store that outlives them all
  if (rank_ != 0) stop_heartbeat();
  leave_together();
  stop_heartbeat();
}

void World::stop_heartbeat() {
  if (!heartbeat_ || !heartbeat_->thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(heartbeat_->mutex);
    heartbeat_->stop = true;
  }
  heartbeat_->wake.notify_all();
  heartbeat_->thread.join();
}

void World::leave_together() {
  try {
    store_->set(key("done/", rank_), std::vector<uint8_t>{1});
    if (rank_ != 0) return;
    // A peer that is still working uses the store; one that died would be waited for in vain,
    // so its heartbeat is watched: standing still for 8 periods means it is gone.
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(10));
    std::map<int, std::pair<int64_t, int>> beats;  // rank -> (last count, periods unchanged)
    while (std::chrono::steady_clock::now() < deadline) {
      bool waiting = false;
      for (int r = 1; r < size_; ++r) {
        if (store_->check({key("done/", r)}) || store_->check({key("left/", r)})) continue;
        const int64_t beat = store_->add(key("hb/", r), 0);
        auto [it, first] = beats.try_emplace(r, beat, 0);
        auto& [last, still] = it->second;
        still = !first && last == beat ? still + 1 : 0;
        last = beat;
        waiting = waiting || still < 8;
      }
      if (!waiting) return;
      std::this_thread::sleep_for(kHeartbeatPeriod);
    }
  } catch (const std::exception&) {
    // The store is already unreachable: nobody is left to cut off.
  }
}

void World::wait_for_all_ranks() const {
  if (simulated_) return;
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(key("joined/", r));
  try {
    store_->wait(keys, options_.timeout);
  } catch (const std::exception&) {
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      bool joined = false;
      try {
        joined = store_->check({key("joined/", r)});
      } catch (const std::exception&) {
      }
      if (!joined) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    TE_FAIL("rank ", rank_, ": rank(s) ", missing, " of ", size_, " did not join within ",
            options_.timeout.count() / 1000.0, " s; start every rank (te-run --nproc ", size_,
            " starts them all), or raise the timeout (TE_DIST_TIMEOUT_S)");
  }
}

void World::mark_left(const std::string& reason) const {
  try {
    // Numbered in the order ranks leave, so a survivor can name the first (the cause) first.
    const int64_t order = store_->add("left_count", 1);
    const std::string text = std::to_string(order) + "\n" + reason.substr(0, 300);
    store_->set(key("left/", rank_), std::vector<uint8_t>(text.begin(), text.end()));
  } catch (const std::exception&) {
  }
}

std::string World::describe_missing(const std::vector<int64_t>& ranks) const {
  std::string out;
  auto note = [&out](int64_t r, const std::string& why) {
    out += (out.empty() ? "rank " : "; rank ") + std::to_string(r) + " " + why;
  };
  try {
    // A peer that failed records why as it leaves, which may land just after our own error:
    // look a few times before calling it silent.
    std::vector<int64_t> silent;
    for (int attempt = 0; attempt < 4 && out.empty(); ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(kHeartbeatPeriod);
      silent.clear();
      std::vector<std::tuple<int64_t, int64_t, std::string>> left;  // (order, rank, reason)
      for (int64_t r : ranks) {
        if (r == rank_) continue;
        if (!store_->check({key("joined/", r)})) {
          note(r, "never joined");
        } else if (store_->check({key("left/", r)})) {
          const auto bytes = store_->get(key("left/", r));
          const std::string text(bytes.begin(), bytes.end());
          const auto newline = text.find('\n');
          left.emplace_back(std::stoll(text.substr(0, newline)), r, text.substr(newline + 1));
        } else {
          silent.push_back(r);
        }
      }
      // The first to leave first: the others usually left because of it.
      std::sort(left.begin(), left.end());
      for (const auto& [order, r, why] : left) note(r, "left with an error: " + why);
    }
    if (out.empty() && heartbeat_ && !silent.empty()) {
      // A live rank's heartbeat advances within a few periods; a dead one's does not.
      std::vector<int64_t> before;
      for (int64_t r : silent) before.push_back(store_->add(key("hb/", r), 0));
      std::this_thread::sleep_for(kHeartbeatPeriod * 6);
      for (std::size_t i = 0; i < silent.size(); ++i) {
        if (store_->add(key("hb/", silent[i]), 0) == before[i]) {
          note(silent[i], "stopped responding (its process died or hangs)");
        }
      }
    }
  } catch (const std::exception&) {
    out += (out.empty() ? "" : "; ") +
           std::string("rank 0 is gone (the store it hosts is unreachable)");
  }
  return out;
}

std::vector<std::string> World::exchange(const std::string& topic, const std::string& mine,
                                         const std::string& what) const {
  try {
    return exchange_or_throw(topic, mine, what);
  } catch (const te::Error&) {
    throw;
  } catch (const std::exception& e) {
    TE_FAIL("rank ", rank_, ": ", what,
            " failed: rank 0 is gone (the store it hosts is unreachable: ", e.what(), ")");
  }
}

void World::linger(const std::string& topic) const {
  try {
    store_->set(topic + "/seen/" + std::to_string(rank_), std::vector<uint8_t>{1});
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r) keys.push_back(topic + "/seen/" + std::to_string(r));
    store_->wait(keys,
                 std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(5)));
  } catch (const std::exception&) {
  }
}

std::vector<std::string> World::exchange_or_throw(const std::string& topic, const std::string& mine,
                                                  const std::string& what) const {
  if (simulated_) return std::vector<std::string>(static_cast<std::size_t>(size_), mine);
  store_->set(topic + "/" + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back(topic + "/" + std::to_string(r));
  // Waits in slices, so a peer that has already failed is named now rather than at the timeout.
  const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
  // Of each absent rank: its last heartbeat count seen, and for how many slices it stood still.
  // Two still slices (4 s, 16 periods) mean a dead process, not a slow one.
  std::map<int64_t, std::pair<int64_t, int>> beats;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      store_->wait(keys, std::max(std::chrono::milliseconds(1),
                                  std::min<std::chrono::milliseconds>(left, kHeartbeatPeriod * 8)));
      break;
    } catch (const std::exception&) {
    }
    std::vector<int64_t> absent;
    bool gone = false;
    for (int r = 0; r < size_; ++r) {
      if (store_->check({keys[static_cast<std::size_t>(r)]})) continue;
      absent.push_back(r);
      gone = gone || store_->check({key("left/", r)});
      if (heartbeat_) {
        const int64_t beat = store_->add(key("hb/", r), 0);
        const auto [seen, first_look] = beats.try_emplace(r, beat, 0);
        auto& [last, still] = seen->second;
        still = !first_look && last == beat ? still + 1 : 0;
        last = beat;
        gone = gone || still >= 2;
      }
    }
    if (gone || std::chrono::steady_clock::now() >= deadline) {
      std::ostringstream when;
      if (!gone) when << " within " << options_.timeout.count() / 1000.0 << " s";
      const std::string why = describe_missing(absent);
      TE_FAIL("rank ", rank_, ": rank(s) ", join_ranks(absent), " of ", size_, " did not reach ",
              what, when.str(), why.empty() ? std::string() : " (" + why + ")",
              "; every rank must run the same collective steps in the same order");
    }
  }
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    const auto bytes = store_->get(k);
    out.emplace_back(bytes.begin(), bytes.end());
  }
  return out;
}

std::shared_ptr<World> thread_world() { return thread_worlds().top_or(nullptr); }

void push_thread_world(const void* owner, std::shared_ptr<World> world) {
  thread_worlds().push(owner, std::move(world));
}

void pop_thread_world(const void* owner) { thread_worlds().pop(owner); }

std::shared_ptr<World> current_world() {
  if (auto world = thread_world()) return world;
  ProcessWorld& pw = process_world();
  std::lock_guard<std::mutex> lock(pw.mutex);
  return pw.world;
}

}  // namespace detail

int world_rank() {
  auto world = detail::current_world();
  return world ? world->rank() : 0;
}

int world_size() {
  auto world = detail::current_world();
  return world ? world->size() : 1;
}

bool is_distributed() { return world_size() > 1; }

namespace comm {
c10::intrusive_ptr<c10d::Store> world_store() {
  auto world = detail::current_world();
  return world ? world->store() : c10::intrusive_ptr<c10d::Store>();
}
}  // namespace comm

int local_rank() {
  auto world = detail::current_world();
  return world ? world->local_rank() : 0;
}

c10::Device device_for_local_rank(int local_rank, int gpus) {
  if (gpus <= 0) return c10::Device(c10::kCPU);
  TE_CHECK(local_rank >= 0, "local_device: rank ", world_rank(), " has LOCAL_RANK ", local_rank,
           ": set LOCAL_RANK to the rank's index on its host (0, 1, ...)");
  TE_CHECK(local_rank < gpus, "local_device: rank ", world_rank(), " has LOCAL_RANK ", local_rank,
           ", but this host has ", gpus,
           " GPU(s): start at most one rank per GPU on each host (te-run --nproc ", gpus,
           "), or set LOCAL_RANK to the rank's index on its host");
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

c10::Device local_device() {
  return device_for_local_rank(local_rank(),
                               at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0);
}

}  // namespace te
