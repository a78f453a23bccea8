#pragma once

// Who started this process, and as which rank: the environments of the launchers te-cpp joins
// (torchrun and te-run, Open MPI's mpirun, SLURM's srun), read into one description. Pure C++:
// init_distributed, configure_threads and the launchers' tests share it.

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace te {

/// Reads one environment variable: nullptr when unset.
using EnvLookup = std::function<const char*(const char* name)>;
/// The process's own environment (std::getenv), the default of every EnvLookup parameter.
const EnvLookup& process_env();

/// A rank's place in a world, as its launcher described it.
struct LaunchEnvironment {
  /// "torchrun" (RANK / WORLD_SIZE: torchrun, te-run, or a user setting them), "openmpi"
  /// (OMPI_COMM_WORLD_*), "slurm" (SLURM_PROCID / SLURM_NTASKS: srun).
  std::string launcher;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        ///< this rank's index on its host
  int local_world_size = 1;  ///< ranks on this host (threads are divided among them)
  int node_rank = 0;         ///< this host's index among the world's hosts
  int nnodes = 1;            ///< hosts in the world, where the launcher says (else 1)
  std::string master_addr;   ///< the rendezvous host (rank 0 hosts the store there)
  int master_port = 0;
  /// Where master_addr and master_port came from, for messages ("MASTER_ADDR", "the first host of
  /// SLURM_STEP_NODELIST", "SLURM_JOB_ID").
  std::string master_addr_from;
  std::string master_port_from;

  /// One line: the launcher, the variables it read and the rank they give.
  std::string describe() const;
};

/// The launch environment of this process, or nullopt when no launcher's rank variables are set
/// (a single process). Looked for in this order, so a launcher started inside another's job
/// wins (torchrun or mpirun inside a SLURM allocation):
/// - torchrun / te-run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
///   MASTER_PORT;
/// - Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, with MASTER_ADDR and
///   MASTER_PORT naming the rendezvous (the node index assumes ranks placed by node);
/// - SLURM's srun: SLURM_PROCID of SLURM_STEP_NUM_TASKS (a batch script's shell, which has no
///   step variables, is no rank), SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, the tasks of this
///   node from SLURM_STEP_TASKS_PER_NODE (or SLURM_TASKS_PER_NODE), and as master the first host
///   of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) unless MASTER_ADDR is set; the port is
///   MASTER_PORT, else 20000 + (SLURM_JOB_ID % 1000) * 10 + SLURM_STEP_ID % 10 (every task of a
///   step derives the same one).
/// Unset local variables mean one host: LOCAL_WORLD_SIZE the world, LOCAL_RANK the rank's place
/// among LOCAL_WORLD_SIZE.
/// Throws te::Error naming the variable when one is malformed or a rank variable is set without
/// its size. The rendezvous is not required here (a rank that only needs its thread count has
/// none): init_distributed checks it.
std::optional<LaunchEnvironment> read_launch_environment(const EnvLookup& env = {});

/// The hosts of a SLURM host list in order: "node[01-03,07],gpu5" -> node01 node02 node03
/// node07 gpu5 (ranges keep their zero padding; several bracket groups multiply). Throws
/// te::Error naming the list when it is malformed or names more than 2^20 hosts.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

/// The task count of node `node` in SLURM's tasks-per-node form ("2(x3),1": nodes 0-2 run 2
/// tasks, node 3 runs 1). Throws te::Error naming the text when it is malformed or too short.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace te
