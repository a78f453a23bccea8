// Joining a world: init_distributed for ranks that are processes (a launcher's environment, a
// TCP store at the master, Gloo bound to an address every peer reaches) and run_local_ranks for
// ranks that are threads of this process.

#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "internal.h"
#include "network.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/runtime/launch.h"
#include "te/sharding/context.h"

namespace te {

namespace {

// Before any communicator is made: every rank publishes the address its Gloo communicators will
// bind (with a listener on it), and the ranks check, together, that no rank advertises a loopback
// address to a peer on another host (nor two hosts one address) and that each reaches the
// others' addresses. Every rank reads the same records, so all fail at once with the same message
// instead of a Gloo connect that waits out the timeout (or, for a loopback address, never ends).
// Returns the address this rank binds.
detail::BoundAddress settle_address(const detail::World& world, detail::BoundAddress bound) {
  const std::string loopback = detail::loopback_identity();
  // First which ranks share a loopback: a provisional (loopback) choice with a peer elsewhere
  // becomes the route to that peer.
  const auto hosts = world.exchange("net/hosts", loopback + "\t" + bound.address,
                                    "the exchange of host identities");
  if (bound.provisional) {
    for (std::size_t q = 0; q < hosts.size(); ++q) {
      const auto tab = hosts[q].find('\t');
      const std::string address = hosts[q].substr(tab + 1);
      if (hosts[q].substr(0, tab) == loopback || detail::is_loopback_address(address)) continue;
      const std::string why = bound.chosen_by;
      bound = detail::route_to(address, "rank " + std::to_string(q) + "'s address " + address);
      bound.chosen_by += " (" + why.substr(std::string("the route to ").size()) +
                         " is a loopback address on this host)";
      break;
    }
  }
  detail::ProbeListener listener(bound);
  detail::PeerAddress mine;
  mine.address = bound.address;
  mine.probe_port = listener.port();
  mine.loopback = loopback;
  mine.chosen_by = bound.chosen_by;
  mine.host = detail::host_name();
  std::vector<detail::PeerAddress> peers;
  for (const std::string& text :
       world.exchange("net/addresses", mine.encode(), "the exchange of Gloo addresses")) {
    peers.push_back(detail::PeerAddress::decode(text));
  }
  const std::string conflict = detail::address_conflict(peers);
  if (!conflict.empty()) {
    world.linger("net/addresses");
    TE_FAIL(conflict);
  }
  const auto probe_timeout =
      std::min<std::chrono::milliseconds>(world.options().timeout, std::chrono::seconds(10));
  std::string failures;
  for (const std::string& f : detail::probe_peers(peers, world.rank(), probe_timeout)) {
    failures += (failures.empty() ? "" : "\n") + f;
  }
  // The listener stays open until every rank has probed: this exchange is also the barrier.
  const auto reports = world.exchange("net/probes", failures, "the check of Gloo addresses");
  for (std::size_t r = 0; r < reports.size(); ++r) {
    if (reports[r].empty()) continue;
    const std::string first = reports[r].substr(0, reports[r].find('\n'));
    const auto q = static_cast<std::size_t>(std::stoul(first.substr(5)));  // "rank Q's ..."
    world.linger("net/probes");
    TE_FAIL("rank ", r, " (address ", peers[r].address, ", chosen by ", peers[r].chosen_by,
            ") cannot reach ", first, ", chosen by ", peers.at(q).chosen_by, " on host ",
            peers.at(q).host, "; set GLOO_SOCKET_IFNAME on rank ", q,
            "'s host to an interface the other hosts reach (or DistributedOptions::interface)");
  }
  return bound;
}

}  // namespace

void init_distributed(const DistributedOptions& options_in) {
  const DistributedOptions options = detail::with_env_overrides(options_in);
  const auto launch = read_launch_environment();
  TE_CHECK(launch.has_value(),
           "init_distributed: RANK and WORLD_SIZE (or OMPI_COMM_WORLD_RANK/SIZE, or srun's "
           "SLURM_PROCID/SLURM_STEP_NUM_TASKS) are not set; start the program with te-run --nproc "
           "N -- prog (or "
           "torchrun, mpirun, srun)");
  TE_CHECK(!launch->master_addr.empty() && launch->master_port != 0,
           "init_distributed: ", launch->describe(),
           " names no rendezvous: set MASTER_ADDR and MASTER_PORT to rank 0's host and a free "
           "port there (te-run and torchrun set them)");
  const std::string& addr = launch->master_addr;
  const auto port = static_cast<std::uint16_t>(launch->master_port);
  const int rank = launch->rank;
  const int size = launch->world_size;

  detail::ProcessWorld& pw = detail::process_world();
  std::lock_guard<std::mutex> lock(pw.mutex);
  TE_CHECK(pw.world == nullptr, "init_distributed was already called in this process (rank ",
           pw.world ? pw.world->rank() : -1, "); call shutdown_distributed() first");

  c10d::TCPStoreOptions store_options;
  store_options.port = port;
  store_options.isServer = rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(size);
  // Joining is checked below with per-rank keys, which can say who is missing.
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
#if TE_TCPSTORE_HAS_LIBUV
  // LibTorch 2.4+ asks for a libuv store by default; Debian's LibTorch 2.6 is built without
  // libuv and would refuse to start ("use_libuv was requested"). The classic store serves the
  // few keys a te-cpp world uses just as well.
  store_options.useLibUV = false;
#endif
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
  } catch (const std::exception& e) {
    TE_FAIL("init_distributed: rank ", rank, " could not reach the store at ", addr, ":", port,
            " (", launch->master_addr_from, ", ", launch->master_port_from, ") within ",
            options.timeout.count() / 1000.0,
            " s (rank 0 hosts it; is it running, and is the port free?): ", e.what());
  }
  auto world = std::make_shared<detail::World>(c10::make_intrusive<c10d::PrefixStore>("te", store),
                                               rank, size, launch->local_rank, options,
                                               std::string(), /*heartbeat=*/true);
  world->wait_for_all_ranks();
  detail::BoundAddress bound;
  try {
    bound = settle_address(*world, detail::choose_gloo_address(options.interface, addr, port,
                                                               launch->master_addr_from));
  } catch (const std::exception& e) {
    // The peers name this rank and its reason at once rather than waiting for it.
    world->mark_left(e.what());
    throw;
  }
  world->set_gloo_host(bound.address);
  pw.description =
      launch->describe() + "; Gloo binds " + bound.address + " (chosen by " + bound.chosen_by + ")";
  pw.world = std::move(world);
}

void shutdown_distributed() {
  detail::ProcessWorld& pw = detail::process_world();
  std::lock_guard<std::mutex> lock(pw.mutex);
  pw.world.reset();
  pw.description.clear();
}

std::string launch_description() {
  detail::ProcessWorld& pw = detail::process_world();
  std::lock_guard<std::mutex> lock(pw.mutex);
  return pw.description;
}

void run_simulated_rank(int world_size, int rank, const std::function<void()>& fn,
                        const DistributedOptions& options) {
  TE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "run_simulated_rank: rank ", rank,
           " of ", world_size,
           " ranks; give a world of at least one rank and a rank in [0, world_size)");
  const detail::ThreadWorldScope world(std::make_shared<detail::World>(
      c10::make_intrusive<c10d::HashStore>(), rank, world_size, rank, options, "",
      /*heartbeat=*/false, /*simulated=*/true));
  fn();
}

void run_local_ranks(int world_size, const std::function<void(int rank)>& fn,
                     const DistributedOptions& options_in) {
  TE_CHECK(world_size >= 1, "run_local_ranks: world_size must be at least 1, got ", world_size);
  TE_CHECK(options_in.threads_per_rank >= 0,
           "run_local_ranks: threads_per_rank must be 0 (split "
           "the caller's threads among the ranks) or positive, got ",
           options_in.threads_per_rank);
  const DistributedOptions options = detail::with_env_overrides(options_in);
  // at::set_num_threads sets the calling thread's OpenMP team size (and a process-wide default
  // that threads LibTorch starts later read): each rank sets its own, the caller's is put back.
  const int caller_threads = at::get_num_threads();
  const int per_rank = options.threads_per_rank > 0 ? options.threads_per_rank
                                                    : std::max(1, caller_threads / world_size);
  auto store = c10::make_intrusive<c10d::HashStore>();
  const ShardingContext context = capture_sharding_context();

  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      std::optional<detail::ThreadWorldScope> world;
      try {
        ShardingContextScope scope(context);
        at::set_num_threads(per_rank);
        world.emplace(std::make_shared<detail::World>(store, rank, world_size, rank, options,
                                                      "127.0.0.1", /*heartbeat=*/false));
        fn(rank);
      } catch (...) {
        if (const auto world = detail::thread_world()) {
          std::string reason = "unknown exception";
          try {
            throw;
          } catch (const std::exception& e) {
            reason = e.what();
          } catch (...) {
          }
          world->mark_left(reason);
        }
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
      // Dropping the world closes this rank's connections, so peers blocked on it fail fast.
      world.reset();
    });
  }
  for (std::thread& t : threads) t.join();
  at::set_num_threads(caller_threads);
  if (first) std::rethrow_exception(first);
}

}  // namespace te
