// Which communicator carries a row's collectives: the backend registry (backend.h), a world's
// connect (a communicator over a row's ranks, rendezvousing under the row's key) and RowComm
// (a row's communicators, one per backend, chosen by the world's options and the tensor's
// device).

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <list>
#include <mutex>

#include "internal.h"
#include "te/distributed/backend.h"
#include "te/error.h"

namespace te {
namespace comm {

namespace {

// The registered backends in order; a list, so a kind found stays where it is while others join.
struct Registry {
  std::mutex mutex;
  std::list<BackendKind> kinds;
};

Registry& registry() {
  // The built-in backends are its first entries, whatever order static initialisers run in.
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: registrations may outlive static destruction
    reg->kinds.push_back(
        {"gloo", {c10::kCPU, c10::kCUDA}, {c10::kCPU}, make_gloo_backend, gloo_built()});
    reg->kinds.push_back({"nccl", {c10::kCUDA}, {c10::kCUDA}, make_nccl_backend, nccl_built()});
    return reg;
  }();
  return *r;
}

// "auto" and every registered name, e.g. "auto, gloo or nccl".
std::string choices(const std::list<BackendKind>& kinds) {
  std::vector<std::string> names = {"auto"};
  for (const BackendKind& k : kinds) names.push_back(k.name);
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return out;
}

}  // namespace

const char* Backend::send_recv(const at::Tensor& send, int to, at::Tensor& recv, int from,
                               int size) {
  // An all-to-all in which only the pair's pieces have bytes: every rank of the row calls it at
  // once, so it completes as a permutation does.
  std::vector<int64_t> in_sizes(static_cast<std::size_t>(size), 0);
  std::vector<int64_t> out_sizes(static_cast<std::size_t>(size), 0);
  in_sizes[static_cast<std::size_t>(to)] = send.numel();
  out_sizes[static_cast<std::size_t>(from)] = recv.numel();
  return all_to_all(send, recv, in_sizes, out_sizes);
}

void register_backend(BackendKind kind) {
  TE_CHECK(!kind.name.empty() && kind.name != "auto", "register_backend: the name '", kind.name,
           "' cannot name a backend; give it a name of its own");
  TE_CHECK(static_cast<bool>(kind.make), "register_backend: backend '", kind.name,
           "' has no factory (BackendKind::make)");
  TE_CHECK(!kind.carries.empty(), "register_backend: backend '", kind.name,
           "' carries no device type; list the devices whose tensors it moves");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const BackendKind& k : r.kinds) {
    TE_CHECK(k.name != kind.name, "register_backend: a backend named '", kind.name,
             "' is already registered; give this one another name");
  }
  r.kinds.push_back(std::move(kind));
}

std::vector<std::string> backend_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const BackendKind& k : r.kinds) out.push_back(k.name);
  return out;
}

BackendKind find_backend(const std::string& name, const std::string& what) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const BackendKind& k : r.kinds) {
    if (k.name == name) return k;
  }
  TE_FAIL(what, "='", name, "' is not ", choices(r.kinds));
}

std::optional<BackendKind> auto_backend(c10::DeviceType type) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const BackendKind& k : r.kinds) {
    if (k.built &&
        std::find(k.preferred_for.begin(), k.preferred_for.end(), type) != k.preferred_for.end()) {
      return k;
    }
  }
  for (const BackendKind& k : r.kinds) {
    if (k.built && k.carries_type(type)) return k;
  }
  return std::nullopt;
}

}  // namespace comm

namespace detail {

namespace {

// A simulated world's only communicator kind (run_simulated_rank): never in the registry, so no
// real world can ask for it.
const comm::BackendKind& simulated_kind() {
  static const comm::BackendKind kind{
      "simulated", {c10::kCPU, c10::kCUDA, c10::kMeta}, {}, comm::make_simulated_backend};
  return kind;
}

}  // namespace

std::unique_ptr<Backend> World::connect(const comm::BackendKind& kind, const std::string& key,
                                        const std::vector<int64_t>& ranks,
                                        const CollectiveAlgorithms& algorithms,
                                        const c10::Device& device) const {
  const auto it = std::find(ranks.begin(), ranks.end(), int64_t{rank_});
  TE_CHECK(it != ranks.end(), "internal: rank ", rank_, " is not in group ", key);
  comm::BackendSetup setup;
  setup.key = key + "/" + kind.name;
  setup.store = c10::make_intrusive<c10d::PrefixStore>(setup.key + "/" + join_ranks(ranks), store_);
  setup.ranks = ranks;
  setup.rank = static_cast<int>(it - ranks.begin());
  setup.size = static_cast<int>(ranks.size());
  setup.timeout = options_.timeout;
  setup.device = device;
  setup.algorithms = algorithms;
  setup.gloo_host = gloo_host_;
  try {
    return kind.make(setup);
  } catch (const te::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string missing = describe_missing(ranks);
    TE_FAIL("rank ", rank_, " could not connect the ", kind.name, " communicator of ranks [",
            join_ranks(ranks), "] (", key, ") within ", options_.timeout.count() / 1000.0, " s: ",
            missing.empty() ? std::string("a peer rank did not join") : "missing " + missing,
            "; every rank must construct the same meshes in the same order. The backend said: ",
            e.what());
  }
}

RowComm::RowComm(const World* world, std::string key, std::vector<int64_t> ranks,
                 CollectiveAlgorithms algorithms)
    : world_(world), key_(std::move(key)), ranks_(std::move(ranks)), algorithms_(algorithms) {
  // The communicator the options name is made with the row, so a world that cannot make it
  // (no GPU for NCCL, a peer that never joins) fails at the mesh, on every rank alike. Under
  // "auto" the CPU's is made now and a GPU's on the row's first CUDA collective.
  if (world_->simulated()) {
    simulated_ = world_->connect(simulated_kind(), key_, ranks_, algorithms_, c10::kCPU);
    return;
  }
  const std::string& wanted = world_->options().backend;
  if (wanted != "auto") {
    // Made up front on the CPU when it carries CPU tensors, else on this rank's device of the
    // first type it carries (a GPU backend: te::local_device()'s index).
    const comm::BackendKind kind = comm::find_backend(wanted, "DistributedOptions::backend");
    const c10::DeviceType type = kind.carries_type(c10::kCPU) ? c10::kCPU : kind.carries.front();
    make(kind, type == c10::kCPU
                   ? c10::Device(c10::kCPU)
                   : c10::Device(type, static_cast<c10::DeviceIndex>(world_->local_rank())));
  } else if (const auto cpu = comm::auto_backend(c10::kCPU)) {
    make(*cpu, c10::kCPU);
  }
}

Backend& RowComm::make(const comm::BackendKind& kind, const c10::Device& device) {
  std::unique_ptr<Backend>& slot = made_[kind.name];
  if (!slot) slot = world_->connect(kind, key_, ranks_, algorithms_, device);
  return *slot;
}

Backend& RowComm::for_device(const c10::Device& device, const std::string& axis) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (simulated_) return *simulated_;
  // Every collective asks; after the first on a device type the answer is the one chosen then.
  auto it = chosen_.find(device.type());
  if (it == chosen_.end()) it = chosen_.emplace(device.type(), choose(device, axis)).first;
  const auto& [name, backend] = it->second;
  TE_CHECK(backend->moves(device), "a collective over mesh axis '", axis, "' got a tensor on ",
           device, ", but this rank's ", name,
           " communicator runs on another device: keep every tensor of a rank on its "
           "te::local_device()");
  return *backend;
}

std::pair<std::string, Backend*> RowComm::choose(const c10::Device& device,
                                                 const std::string& axis) {
  const std::string& wanted = world_->options().backend;
  std::optional<comm::BackendKind> kind;
  if (wanted == "auto") {
    kind = comm::auto_backend(device.type());
    TE_CHECK(kind.has_value(), "a collective over mesh axis '", axis, "' got a tensor on ", device,
             "; no backend of this build moves ", device.type(),
             " tensors (te-cpp moves CPU tensors on Gloo and CUDA tensors on NCCL)");
  } else {
    kind = comm::find_backend(wanted, "DistributedOptions::backend");
    TE_CHECK(kind->carries_type(device.type()), "a collective over mesh axis '", axis,
             "' got a tensor on ", device, ", but this world's backend is ", wanted,
             ", which moves ", device_list(kind->carries),
             " tensors only: put the tensor on te::local_device(), or use the \"auto\" backend");
  }
  const c10::Device made_for =
      device.is_cuda() && !device.has_index() ? c10::Device(c10::kCUDA, 0) : device;
  return {kind->name, &make(*kind, made_for)};
}

std::string RowComm::device_list(const std::vector<c10::DeviceType>& types) {
  std::string out;
  for (std::size_t i = 0; i < types.size(); ++i) {
    out += (i == 0                  ? ""
            : i + 1 == types.size() ? " and "
                                    : ", ") +
           c10::DeviceTypeName(types[i], /*lower_case=*/false);
  }
  return out;
}

}  // namespace detail
}  // namespace te
