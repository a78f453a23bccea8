// The launchers' environments: torchrun / te-run, Open MPI and SLURM read into one description,
// SLURM's host lists and tasks-per-node forms, and the threads a rank gets from them.

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "../expect_error.h"
#include "../fake_env.h"
#include "te/runtime.h"

namespace te {
namespace {

using test::Env;
using test::env_of;

TEST(LaunchEnvironment, NoneWithoutRankVariables) {
  Env env{{"MASTER_ADDR", "10.0.0.1"}, {"PATH", "/bin"}};
  EXPECT_FALSE(read_launch_environment(env_of(env)).has_value());
}

TEST(LaunchEnvironment, TorchrunAcrossNodes) {
  Env env{{"RANK", "5"},           {"WORLD_SIZE", "8"},
          {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"},     {"MASTER_ADDR", "10.0.0.1"},
          {"MASTER_PORT", "29500"}};
  const auto l = read_launch_environment(env_of(env));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->launcher, "torchrun");
  EXPECT_EQ(l->rank, 5);
  EXPECT_EQ(l->world_size, 8);
  EXPECT_EQ(l->local_rank, 1);
  EXPECT_EQ(l->local_world_size, 4);
  EXPECT_EQ(l->node_rank, 1);
  EXPECT_EQ(l->nnodes, 2);
  EXPECT_EQ(l->master_addr, "10.0.0.1");
  EXPECT_EQ(l->master_port, 29500);
  EXPECT_EQ(l->describe(),
            "torchrun environment: rank 5 of 8, local rank 1 of 4 on node 1 of 2, master "
            "10.0.0.1 (MASTER_ADDR):29500 (MASTER_PORT)");
}

TEST(LaunchEnvironment, AnUnsetLocalRankIsTheRanksPlaceOnItsHost) {
  Env env{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}};
  const auto l = read_launch_environment(env_of(env));
  EXPECT_EQ(l->local_rank, 1);
  EXPECT_EQ(l->node_rank, 1);
}

TEST(LaunchEnvironment, RankAndSizeAloneMeanOneHost) {
  Env env{{"RANK", "2"}, {"WORLD_SIZE", "3"}};
  const auto l = read_launch_environment(env_of(env));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->local_rank, 2);
  EXPECT_EQ(l->local_world_size, 3);
  EXPECT_EQ(l->node_rank, 0);
  EXPECT_EQ(l->nnodes, 1);
  EXPECT_TRUE(l->master_addr.empty());
}

TEST(LaunchEnvironment, OpenMpi) {
  Env env{{"OMPI_COMM_WORLD_RANK", "3"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
          {"MASTER_ADDR", "h0"},
          {"MASTER_PORT", "1234"}};
  const auto l = read_launch_environment(env_of(env));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->launcher, "openmpi");
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->local_rank, 1);
  EXPECT_EQ(l->local_world_size, 2);
  EXPECT_EQ(l->node_rank, 1);
  EXPECT_EQ(l->nnodes, 2);
}

Env slurm_step() {
  return Env{{"SLURM_PROCID", "6"},
             {"SLURM_NTASKS", "9"},
             {"SLURM_STEP_NUM_TASKS", "7"},
             {"SLURM_STEP_ID", "3"},
             {"SLURM_LOCALID", "0"},
             {"SLURM_NODEID", "3"},
             {"SLURM_NNODES", "4"},
             {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
             {"SLURM_TASKS_PER_NODE", "9(x4)"},
             {"SLURM_STEP_NODELIST", "gpu[007-009],cpu3"},
             {"SLURM_JOB_NODELIST", "other[1-9]"},
             {"SLURM_JOB_ID", "123456"}};
}

TEST(LaunchEnvironment, SlurmStep) {
  const Env env = slurm_step();
  const auto l = read_launch_environment(env_of(env));
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->launcher, "slurm");
  EXPECT_EQ(l->rank, 6);
  EXPECT_EQ(l->world_size, 7);  // the step's tasks, not the allocation's
  EXPECT_EQ(l->local_rank, 0);
  EXPECT_EQ(l->local_world_size, 1);  // node 3 of "2(x3),1"; the step's form wins the job's
  EXPECT_EQ(l->node_rank, 3);
  EXPECT_EQ(l->nnodes, 4);
  EXPECT_EQ(l->master_addr, "gpu007");  // the step's first host, not the job's
  EXPECT_EQ(l->master_addr_from, "the first host of SLURM_STEP_NODELIST");
  EXPECT_EQ(l->master_port, 20000 + 456 * 10 + 3);
  EXPECT_EQ(l->master_port_from, "SLURM_JOB_ID and SLURM_STEP_ID");
}

// A batch script's own shell has SLURM_PROCID=0 and SLURM_NTASKS but no step: it is one
// process (te-encoder --nproc 4 there starts its own ranks), not rank 0 of 4.
TEST(LaunchEnvironment, ABatchScriptIsNoRank) {
  Env env{{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", "0"},
          {"SLURM_JOB_NODELIST", "gnode[10,20]"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"},
          {"SLURM_JOB_ID", "200505"}};
  EXPECT_FALSE(read_launch_environment(env_of(env)).has_value());
}

TEST(LaunchEnvironment, SlurmTakesMasterAddrAndPortWhenSet) {
  Env env = slurm_step();
  env["MASTER_ADDR"] = "10.1.2.3";
  env["MASTER_PORT"] = "4000";
  const auto l = read_launch_environment(env_of(env));
  EXPECT_EQ(l->master_addr, "10.1.2.3");
  EXPECT_EQ(l->master_port, 4000);
  env.erase("SLURM_STEP_NODELIST");
  env.erase("MASTER_ADDR");
  EXPECT_EQ(read_launch_environment(env_of(env))->master_addr, "other1");
}

TEST(LaunchEnvironment, ALauncherInsideAnAllocationWins) {
  Env env = slurm_step();
  env["OMPI_COMM_WORLD_RANK"] = "1";
  env["OMPI_COMM_WORLD_SIZE"] = "2";
  EXPECT_EQ(read_launch_environment(env_of(env))->launcher, "openmpi");
  env["RANK"] = "0";
  env["WORLD_SIZE"] = "2";
  EXPECT_EQ(read_launch_environment(env_of(env))->launcher, "torchrun");
}

TEST(LaunchEnvironment, MalformedVariablesAreNamed) {
  Env rank_only{{"RANK", "1"}};
  EXPECT_ERROR(read_launch_environment(env_of(rank_only)), "WORLD_SIZE is not set, but RANK is");
  Env big{{"RANK", "4"}, {"WORLD_SIZE", "4"}};
  EXPECT_ERROR(read_launch_environment(env_of(big)), "RANK='4' is not an integer in [0, 3]");
  Env local{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}};
  EXPECT_ERROR(read_launch_environment(env_of(local)), "local rank 2 of 2");
  Env slurm = slurm_step();
  slurm["SLURM_STEP_NODELIST"] = "gpu[1-";
  EXPECT_ERROR(read_launch_environment(env_of(slurm)),
               "SLURM_STEP_NODELIST: the SLURM host list 'gpu[1-' is malformed");
  slurm = slurm_step();
  slurm["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  EXPECT_ERROR(read_launch_environment(env_of(slurm)),
               "SLURM_STEP_TASKS_PER_NODE: '2(x2)' names the tasks of 2 node(s), not of node 3");
  slurm = slurm_step();
  slurm["MASTER_PORT"] = "70000";
  EXPECT_ERROR(read_launch_environment(env_of(slurm)),
               "MASTER_PORT='70000' is not an integer in [1, 65535]");
}

TEST(SlurmHostlist, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("node1"), V{"node1"});
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,07],gpu5"),
            (V{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_hostlist("rack[1-2]-n[8-9]"),
            (V{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(expand_slurm_hostlist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  for (const char* bad : {"", "a,,b", "n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[]",
                          "n[99999999999999999999]", "a[1-1000]-b[1-1000]-c[1-2]"}) {
    EXPECT_ERROR(expand_slurm_hostlist(bad), "is malformed");
  }
}

TEST(SlurmTasksPerNode, ReadsEachNodesCount) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_ERROR(slurm_tasks_on_node("2(x3", 0), "tasks-per-node form");
  EXPECT_ERROR(slurm_tasks_on_node("x", 0), "the task count='x'");
}

}  // namespace
}  // namespace te
