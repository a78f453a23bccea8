// te-run: starts the ranks of a program on this machine the way torchrun does (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT): all of a one-node world, or
// this node's share of a world of several (one te-run per node, --nnodes / --node-rank). It
// prefixes each rank's output lines, and when one of its ranks fails stops the others and exits
// with that rank's status.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int sig) { g_interrupted = sig; }

// A port the kernel considers free right now on loopback.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

struct Rank {
  int index = 0;
  pid_t pid = -1;
  int out_fd = -1;      // read end of the rank's merged stdout + stderr
  std::string pending;  // a partial line not yet printed
  bool running = true;
  int status = 0;  // exit code, or 128 + signal
};

void emit(const Rank& r, const std::string& line, bool prefix) {
  std::string text = prefix ? "[rank " + std::to_string(r.index) + "] " + line : line;
  text += '\n';
  // One write per line keeps lines of different ranks from interleaving.
  ssize_t off = 0;
  while (off < static_cast<ssize_t>(text.size())) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + off, text.size() - off);
    if (n <= 0) break;
    off += n;
  }
}

void drain(Rank& r, bool prefix, bool final) {
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(r.out_fd, buf, sizeof(buf));
    if (n <= 0) break;
    r.pending.append(buf, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = r.pending.find('\n')) != std::string::npos) {
      emit(r, r.pending.substr(0, nl), prefix);
      r.pending.erase(0, nl + 1);
    }
  }
  if (final && !r.pending.empty()) {
    emit(r, r.pending, prefix);
    r.pending.clear();
  }
}

struct Options {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  double grace = 5.0;
  bool no_prefix = false;
  std::vector<std::string> command;
};

// The options checked, and the master's address and port filled in on one node; 0, or the exit
// code once the problem is printed.
int check_options(Options& o) {
  if (o.node_rank >= o.nnodes) {
    std::cerr << "te-run: --node-rank " << o.node_rank << " is not a node of --nnodes " << o.nnodes
              << " (nodes are 0 .. " << o.nnodes - 1 << ")\n";
    return 2;
  }
  if (static_cast<int64_t>(o.nnodes) * o.nproc > (1 << 20)) {
    std::cerr << "te-run: --nnodes " << o.nnodes << " x --nproc-per-node " << o.nproc
              << " ranks is more than a world holds (1048576)\n";
    return 2;
  }
  if (o.nnodes > 1 && (o.master_addr.empty() || o.master_port == 0)) {
    std::cerr << "te-run: --nnodes " << o.nnodes << " needs --master-addr and --master-port: every "
              << "node names node 0's address and the same port\n";
    return 2;
  }
  if (o.master_addr.empty()) o.master_addr = "127.0.0.1";
  if (o.master_port == 0) o.master_port = free_port();
  if (o.master_port <= 0) {
    std::cerr << "te-run: could not find a free port on 127.0.0.1; pass --master-port\n";
    return 2;
  }
  return 0;
}

// In the forked child: the rank's output into the pipe, the torchrun environment, then the
// program.
[[noreturn]] void exec_rank(Options o, int i, int fds[2]) {
  ::dup2(fds[1], STDOUT_FILENO);
  ::dup2(fds[1], STDERR_FILENO);
  ::close(fds[0]);
  ::close(fds[1]);
  const int rank = o.node_rank * o.nproc + i;
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(i).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(o.nnodes * o.nproc).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
  ::setenv("GROUP_RANK", std::to_string(o.node_rank).c_str(), 1);
  ::setenv("GROUP_WORLD_SIZE", std::to_string(o.nnodes).c_str(), 1);
  ::setenv("ROLE_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("ROLE_WORLD_SIZE", std::to_string(o.nnodes * o.nproc).c_str(), 1);
  ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  // N ranks share the cores: without a choice of the user's, each gets cores / N threads.
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1L, cores / o.nproc)).c_str(), 1);
  }
  std::vector<char*> args;
  for (std::string& a : o.command) args.push_back(a.data());
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(stderr, "te-run: cannot run %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

// Forks the node's ranks; false (printed) when a pipe or a fork fails.
bool start_ranks(Options& o, std::vector<Rank>& ranks) {
  for (int i = 0; i < o.nproc; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("te-run: pipe");
      return false;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("te-run: fork");
      return false;
    }
    if (pid == 0) exec_rank(o, i, fds);
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    ranks[static_cast<std::size_t>(i)] = Rank{o.node_rank * o.nproc + i, pid, fds[0], {}, true, 0};
  }
  return true;
}

// Relays the ranks' output until all have ended, stopping the others when one fails or te-run is
// interrupted; te-run's exit code.
int supervise(const Options& o, std::vector<Rank>& ranks) {
  int failed = -1;  // the first rank that failed; -2: te-run was interrupted
  // Stopping: first the survivors get `grace` seconds to fail on their own (a library error
  // naming the missing rank is worth more than a SIGTERM), then SIGTERM, then SIGKILL.
  enum class Stop { kNone, kWaiting, kTerminated, kKilled } stop = Stop::kNone;
  auto deadline = std::chrono::steady_clock::time_point::max();
  const auto grace_period = std::chrono::milliseconds(static_cast<int64_t>(o.grace * 1000));
  auto stop_all = [&](int sig) {
    for (Rank& r : ranks) {
      if (r.running) ::kill(r.pid, sig);
    }
  };

  while (true) {
    std::vector<pollfd> fds;
    for (Rank& r : ranks) {
      if (r.out_fd >= 0) fds.push_back({r.out_fd, POLLIN, 0});
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (Rank& r : ranks) {
      if (r.out_fd >= 0) drain(r, !o.no_prefix, false);
    }
    bool any_running = false;
    for (Rank& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      const pid_t done = ::waitpid(r.pid, &status, WNOHANG);
      if (done == r.pid) {
        r.running = false;
        r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        drain(r, !o.no_prefix, true);
        ::close(r.out_fd);
        r.out_fd = -1;
        if (r.status != 0 && failed < 0) {
          failed = r.index;
          std::cerr << "te-run: rank " << r.index
                    << (WIFEXITED(status) ? " exited with status " : " was killed by signal ")
                    << (WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status))
                    << "; stopping the other ranks\n";
        }
      } else {
        any_running = true;
      }
    }
    if (!any_running) break;
    const auto now = std::chrono::steady_clock::now();
    if (g_interrupted && stop < Stop::kTerminated) {
      std::cerr << "te-run: interrupted; stopping the ranks\n";
      if (failed < 0) failed = -2;
      stop_all(SIGTERM);
      stop = Stop::kTerminated;
      deadline = now + grace_period;
    } else if (failed >= 0 && stop == Stop::kNone) {
      stop = Stop::kWaiting;
      deadline = now + grace_period;
    } else if (stop == Stop::kWaiting && now > deadline) {
      stop_all(SIGTERM);
      stop = Stop::kTerminated;
      deadline = now + grace_period;
    } else if (stop == Stop::kTerminated && now > deadline) {
      stop_all(SIGKILL);
      stop = Stop::kKilled;
    }
  }
  if (failed == -2) return 130;
  if (failed >= 0) return ranks[static_cast<std::size_t>(failed - o.node_rank * o.nproc)].status;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "te-run: start the ranks of a program on this machine (the torchrun contract).\n\n"
      "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node),\n"
      "MASTER_ADDR and MASTER_PORT (on one node: 127.0.0.1 and a free port unless given);\n"
      "te::init_distributed() reads them, and OMP_NUM_THREADS (cores / ranks on this node) unless\n"
      "it is set. Output lines are prefixed with [rank k]. When a rank fails, the others have\n"
      "--grace seconds to stop on their own (reporting the failure), then get SIGTERM, then\n"
      "SIGKILL after --grace more; te-run exits with the failed rank's status.\n\n"
      "Several machines: run one te-run per node with the same --nnodes, --nproc-per-node,\n"
      "--master-addr (node 0's address, where rank 0 hosts the rendezvous) and --master-port, and\n"
      "each node's --node-rank; node K starts ranks K*P .. K*P+P-1. Gloo binds the interface on\n"
      "the route to the master unless GLOO_SOCKET_IFNAME names one; NCCL reads "
      "NCCL_SOCKET_IFNAME.\n\n"
      "Examples:\n"
      "  te-run --nproc 2 -- ./build/examples/encoder/te-encoder --mesh data=2\n"
      "  te-run --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 10.0.0.1 \\\n"
      "         --master-port 29500 -- te-encoder --mesh data=2,model=2 ...   # on node 0\n"
      "  te-run --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.0.0.1 \\\n"
      "         --master-port 29500 -- te-encoder --mesh data=2,model=2 ...   # on node 1"};
  Options o;
  app.add_option("--nproc-per-node,--nproc,-n", o.nproc, "ranks to start on this node")
      ->required()
      ->check(CLI::Range(1, 1024));
  app.add_option("--nnodes", o.nnodes, "nodes in the world, each running one te-run (default 1)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--node-rank", o.node_rank, "this node's index, 0 .. nnodes-1 (default 0)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--master-addr", o.master_addr,
                 "node 0's address, where rank 0 hosts the rendezvous (default on one node: "
                 "127.0.0.1; required with --nnodes > 1)");
  app.add_option("--master-port", o.master_port,
                 "rendezvous port (default on one node: a free one; required with --nnodes > 1)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--grace", o.grace,
                 "seconds before SIGTERM, and again before SIGKILL, when stopping")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-prefix", o.no_prefix, "print rank output as it is");
  app.add_option("command", o.command, "the program and its arguments (after --)")->required();
  CLI11_PARSE(app, argc, argv);
  if (const int code = check_options(o); code != 0) return code;

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Rank> ranks(static_cast<std::size_t>(o.nproc));
  if (!start_ranks(o, ranks)) return 2;
  return supervise(o, ranks);
}
