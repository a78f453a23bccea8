#include "te/runtime/launch.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "te/error.h"

namespace te {

namespace {

// A variable's value, or "" when unset.
std::string get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v ? std::string(v) : std::string();
}

long long parse_int(const char* name, const std::string& value, long long lo, long long hi) {
  char* end = nullptr;
  const long long parsed = std::strtoll(value.c_str(), &end, 10);
  TE_CHECK(!value.empty() && *end == '\0' && parsed >= lo && parsed <= hi, name, "='", value,
           "' is not an integer in [", lo, ", ", hi, "]");
  return parsed;
}

// A nested error's message without its " [file:line]" tag (the outer one adds its own).
std::string message_of(const Error& e) {
  std::string m = e.what();
  const auto at = m.rfind(" [");
  if (at != std::string::npos && m.back() == ']') m.erase(at);
  return m;
}

int int_var(const EnvLookup& env, const char* name, long long lo, long long hi, int fallback) {
  const std::string v = get(env, name);
  return v.empty() ? fallback : static_cast<int>(parse_int(name, v, lo, hi));
}

// The rank pair a launcher sets; both or neither (a rank without its world is a mistake).
bool read_pair(const EnvLookup& env, const char* rank_var, const char* size_var,
               LaunchEnvironment& out) {
  const std::string rank = get(env, rank_var);
  const std::string size = get(env, size_var);
  if (rank.empty() && size.empty()) return false;
  TE_CHECK(!rank.empty() && !size.empty(), rank.empty() ? rank_var : size_var, " is not set, but ",
           rank.empty() ? size_var : rank_var,
           " is: a launcher sets both; set the missing one or unset the other");
  out.world_size = static_cast<int>(parse_int(size_var, size, 1, 1 << 20));
  out.rank = static_cast<int>(parse_int(rank_var, rank, 0, out.world_size - 1));
  return true;
}

void read_master(const EnvLookup& env, LaunchEnvironment& out) {
  out.master_addr = get(env, "MASTER_ADDR");
  if (!out.master_addr.empty()) out.master_addr_from = "MASTER_ADDR";
  const std::string port = get(env, "MASTER_PORT");
  if (!port.empty()) {
    out.master_port = static_cast<int>(parse_int("MASTER_PORT", port, 1, 65535));
    out.master_port_from = "MASTER_PORT";
  }
}

void read_slurm(const EnvLookup& env, LaunchEnvironment& out) {
  out.local_rank = int_var(env, "SLURM_LOCALID", 0, out.world_size - 1, 0);
  out.node_rank = int_var(env, "SLURM_NODEID", 0, out.world_size - 1, 0);
  out.nnodes = int_var(env, "SLURM_NNODES", 1, out.world_size, 1);
  out.local_world_size = (out.world_size + out.nnodes - 1) / out.nnodes;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const std::string tasks = get(env, name);
    if (tasks.empty()) continue;
    try {
      out.local_world_size = slurm_tasks_on_node(tasks, out.node_rank);
    } catch (const Error& e) {
      TE_FAIL(name, ": ", message_of(e));
    }
    break;
  }
  if (out.master_addr.empty()) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
      const std::string list = get(env, name);
      if (list.empty()) continue;
      try {
        out.master_addr = expand_slurm_hostlist(list).front();
      } catch (const Error& e) {
        TE_FAIL(name, ": ", message_of(e));
      }
      out.master_addr_from = std::string("the first host of ") + name;
      break;
    }
  }
  if (out.master_port == 0) {
    const std::string job = get(env, "SLURM_JOB_ID");
    if (!job.empty()) {
      // Every task of a step derives the same port; steps 0-9 of one job (run side by side on
      // one node) get different ones.
      const long long id = parse_int("SLURM_JOB_ID", job, 0, 1LL << 62);
      const std::string step_text = get(env, "SLURM_STEP_ID");
      const long long step =
          step_text.empty() ? 0 : parse_int("SLURM_STEP_ID", step_text, 0, 1LL << 62);
      out.master_port = static_cast<int>(20000 + (id % 1000) * 10 + step % 10);
      out.master_port_from = "SLURM_JOB_ID and SLURM_STEP_ID";
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  auto bad = [&list](const std::string& why) {
    TE_FAIL("the SLURM host list '", list, "' is malformed: ", why,
            "; expected e.g. 'node[01-04,07],gpu5'");
  };
  // Split at the commas outside brackets.
  std::vector<std::string> items;
  int depth = 0;
  std::string cur;
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) bad("a ']' closes no '['");
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (depth != 0) bad("a '[' is not closed");
  items.push_back(cur);

  std::vector<std::string> hosts;
  for (const std::string& item : items) {
    if (item.empty()) bad("an empty host name");
    // Each bracket group multiplies what came before it by its values.
    std::vector<std::string> partial{""};
    std::size_t i = 0;
    while (i < item.size()) {
      const std::size_t open = item.find('[', i);
      const std::string literal = item.substr(i, open == std::string::npos ? open : open - i);
      for (std::string& p : partial) p += literal;
      if (open == std::string::npos) break;
      const std::size_t close = item.find(']', open);
      std::vector<std::string> values;
      std::stringstream ranges(item.substr(open + 1, close - open - 1));
      std::string range;
      while (std::getline(ranges, range, ',')) {
        const std::size_t dash = range.find('-');
        const std::string lo = range.substr(0, dash);
        const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
        if (lo.empty() || hi.empty() || lo.size() > 18 || hi.size() > 18 ||
            lo.find_first_not_of("0123456789") != std::string::npos ||
            hi.find_first_not_of("0123456789") != std::string::npos) {
          bad("'" + range + "' is not a number or a range of numbers (of at most 18 digits)");
        }
        const long long a = std::stoll(lo);
        const long long b = std::stoll(hi);
        if (b < a) bad("the range '" + range + "' runs backwards");
        if (b - a > 100000) bad("the range '" + range + "' is too long");
        for (long long v = a; v <= b; ++v) {
          std::string digits = std::to_string(v);
          if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
          values.push_back(digits);
        }
      }
      if (values.empty()) bad("'[]' holds no number");
      if (partial.size() * values.size() + hosts.size() > (1u << 20)) {
        bad("it names more than 1048576 hosts");
      }
      std::vector<std::string> next;
      for (const std::string& p : partial) {
        for (const std::string& v : values) next.push_back(p + v);
      }
      partial.swap(next);
      i = close + 1;
    }
    hosts.insert(hosts.end(), partial.begin(), partial.end());
  }
  return hosts;
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  std::stringstream parts(tasks_per_node);
  std::string part;
  int first = 0;  // the first node index this part covers
  while (std::getline(parts, part, ',')) {
    const std::size_t paren = part.find("(x");
    const std::string count_text = part.substr(0, paren);
    long long repeat = 1;
    if (paren != std::string::npos) {
      TE_CHECK(part.back() == ')', "'", tasks_per_node, "' is not SLURM's tasks-per-node form ",
               "(e.g. '2(x3),1')");
      repeat = parse_int("the repeat count", part.substr(paren + 2, part.size() - paren - 3), 1,
                         1 << 20);
    }
    const int count = static_cast<int>(parse_int("the task count", count_text, 0, 1 << 20));
    if (node < first + repeat) return count;
    first += static_cast<int>(repeat);
  }
  TE_FAIL("'", tasks_per_node, "' names the tasks of ", first, " node(s), not of node ", node);
}

const EnvLookup& process_env() {
  static const EnvLookup env = [](const char* name) -> const char* { return std::getenv(name); };
  return env;
}

std::optional<LaunchEnvironment> read_launch_environment(const EnvLookup& env_in) {
  const EnvLookup& env = env_in ? env_in : process_env();
  LaunchEnvironment out;
  // The local variables: `local_size` ranks on this host (the whole world when unset, as te-run
  // starts them), this one at `local_rank` (its place among them when unset).
  auto read_local = [&](const char* rank_var, const char* size_var) {
    out.local_world_size = int_var(env, size_var, 1, out.world_size, out.world_size);
    out.local_rank = int_var(env, rank_var, 0, out.world_size - 1, out.rank % out.local_world_size);
    out.nnodes = (out.world_size + out.local_world_size - 1) / out.local_world_size;
  };
  if (read_pair(env, "RANK", "WORLD_SIZE", out)) {
    out.launcher = "torchrun";
    read_local("LOCAL_RANK", "LOCAL_WORLD_SIZE");
    out.node_rank =
        int_var(env, "GROUP_RANK", 0, out.world_size - 1, out.rank / out.local_world_size);
    read_master(env, out);
  } else if (read_pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", out)) {
    out.launcher = "openmpi";
    read_local("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
    // Open MPI names no node index: this one holds for ranks placed by node (--map-by slot,
    // the default); it only labels messages.
    out.node_rank = out.rank / out.local_world_size;
    read_master(env, out);
  } else if (!get(env, "SLURM_STEP_NUM_TASKS").empty() &&
             read_pair(env, "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", out)) {
    // srun's tasks. A batch script's own shell also has SLURM_PROCID=0 and SLURM_NTASKS, but no
    // step variables: it is one process, not rank 0 of a world.
    out.launcher = "slurm";
    read_master(env, out);
    read_slurm(env, out);
  } else {
    return std::nullopt;
  }
  TE_CHECK(out.local_rank < out.local_world_size, "the launcher says this rank is local rank ",
           out.local_rank, " of ", out.local_world_size, " on its host (", out.launcher,
           "'s variables); they contradict each other");
  return out;
}

std::string LaunchEnvironment::describe() const {
  std::ostringstream os;
  os << launcher << " environment: rank " << rank << " of " << world_size << ", local rank "
     << local_rank << " of " << local_world_size << " on node " << node_rank << " of " << nnodes;
  if (!master_addr.empty()) os << ", master " << master_addr << " (" << master_addr_from << ")";
  if (master_port != 0) os << ":" << master_port << " (" << master_port_from << ")";
  return os.str();
}

}  // namespace te
