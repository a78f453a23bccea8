// The launchers' environments: torchrun / te-run, Open MPI and SLURM read into one description,
// SLURM's host lists and tasks-per-node forms, and the threads a rank gets from them.

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "te/runtime.h"

namespace te {
namespace {

// An environment of its own for each case.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(LaunchEnvironment, NoneWithoutRankVariables) {
  FakeEnv env{{{"MASTER_ADDR", "10.0.0.1"}, {"PATH", "/bin"}}};
  EXPECT_FALSE(read_launch_environment(env.lookup()).has_value());
}

TEST(LaunchEnvironment, TorchrunAcrossNodes) {
  FakeEnv env{{{"RANK", "5"},
               {"WORLD_SIZE", "8"},
               {"LOCAL_RANK", "1"},
               {"LOCAL_WORLD_SIZE", "4"},
               {"GROUP_RANK", "1"},
               {"MASTER_ADDR", "10.0.0.1"},
               {"MASTER_PORT", "29500"}}};
  const auto l = read_launch_environment(env.lookup());
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

TEST(LaunchEnvironment, RankAndSizeAloneMeanOneHost) {
  FakeEnv env{{{"RANK", "2"}, {"WORLD_SIZE", "3"}}};
  const auto l = read_launch_environment(env.lookup());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->local_rank, 2);
  EXPECT_EQ(l->local_world_size, 3);
  EXPECT_EQ(l->node_rank, 0);
  EXPECT_EQ(l->nnodes, 1);
  EXPECT_TRUE(l->master_addr.empty());
}

TEST(LaunchEnvironment, OpenMpi) {
  FakeEnv env{{{"OMPI_COMM_WORLD_RANK", "3"},
               {"OMPI_COMM_WORLD_SIZE", "4"},
               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
               {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
               {"MASTER_ADDR", "h0"},
               {"MASTER_PORT", "1234"}}};
  const auto l = read_launch_environment(env.lookup());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->launcher, "openmpi");
  EXPECT_EQ(l->rank, 3);
  EXPECT_EQ(l->local_rank, 1);
  EXPECT_EQ(l->local_world_size, 2);
  EXPECT_EQ(l->node_rank, 1);
  EXPECT_EQ(l->nnodes, 2);
}

FakeEnv slurm_step() {
  return FakeEnv{{{"SLURM_PROCID", "6"},
                  {"SLURM_NTASKS", "7"},
                  {"SLURM_LOCALID", "0"},
                  {"SLURM_NODEID", "3"},
                  {"SLURM_NNODES", "4"},
                  {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
                  {"SLURM_TASKS_PER_NODE", "9(x4)"},
                  {"SLURM_STEP_NODELIST", "gpu[007-009],cpu3"},
                  {"SLURM_JOB_NODELIST", "other[1-9]"},
                  {"SLURM_JOB_ID", "123456"}}};
}

TEST(LaunchEnvironment, SlurmStep) {
  const FakeEnv env = slurm_step();
  const auto l = read_launch_environment(env.lookup());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->launcher, "slurm");
  EXPECT_EQ(l->rank, 6);
  EXPECT_EQ(l->world_size, 7);
  EXPECT_EQ(l->local_rank, 0);
  EXPECT_EQ(l->local_world_size, 1);  // node 3 of "2(x3),1"; the step's form wins the job's
  EXPECT_EQ(l->node_rank, 3);
  EXPECT_EQ(l->nnodes, 4);
  EXPECT_EQ(l->master_addr, "gpu007");  // the step's first host, not the job's
  EXPECT_EQ(l->master_addr_from, "the first host of SLURM_STEP_NODELIST");
  EXPECT_EQ(l->master_port, 20000 + 123456 % 10000);
  EXPECT_EQ(l->master_port_from, "SLURM_JOB_ID");
}

TEST(LaunchEnvironment, SlurmTakesMasterAddrAndPortWhenSet) {
  FakeEnv env = slurm_step();
  env.vars["MASTER_ADDR"] = "10.1.2.3";
  env.vars["MASTER_PORT"] = "4000";
  const auto l = read_launch_environment(env.lookup());
  EXPECT_EQ(l->master_addr, "10.1.2.3");
  EXPECT_EQ(l->master_port, 4000);
  env.vars.erase("SLURM_STEP_NODELIST");
  env.vars.erase("MASTER_ADDR");
  EXPECT_EQ(read_launch_environment(env.lookup())->master_addr, "other1");
}

TEST(LaunchEnvironment, ALauncherInsideAnAllocationWins) {
  FakeEnv env = slurm_step();
  env.vars["OMPI_COMM_WORLD_RANK"] = "1";
  env.vars["OMPI_COMM_WORLD_SIZE"] = "2";
  EXPECT_EQ(read_launch_environment(env.lookup())->launcher, "openmpi");
  env.vars["RANK"] = "0";
  env.vars["WORLD_SIZE"] = "2";
  EXPECT_EQ(read_launch_environment(env.lookup())->launcher, "torchrun");
}

TEST(LaunchEnvironment, MalformedVariablesAreNamed) {
  FakeEnv rank_only{{{"RANK", "1"}}};
  EXPECT_NE(error_of([&] {
              read_launch_environment(rank_only.lookup());
            }).find("WORLD_SIZE is not set, but RANK is"),
            std::string::npos);
  FakeEnv big{{{"RANK", "4"}, {"WORLD_SIZE", "4"}}};
  EXPECT_NE(error_of([&] {
              read_launch_environment(big.lookup());
            }).find("RANK='4' is not an integer in [0, 3]"),
            std::string::npos);
  FakeEnv local{
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}};
  EXPECT_NE(error_of([&] { read_launch_environment(local.lookup()); }).find("local rank 2 of 2"),
            std::string::npos);
  FakeEnv slurm = slurm_step();
  slurm.vars["SLURM_STEP_NODELIST"] = "gpu[1-";
  EXPECT_NE(error_of([&] {
              read_launch_environment(slurm.lookup());
            }).find("SLURM_STEP_NODELIST: the SLURM host list 'gpu[1-' is malformed"),
            std::string::npos);
  slurm = slurm_step();
  slurm.vars["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  EXPECT_NE(
      error_of([&] {
        read_launch_environment(slurm.lookup());
      }).find("SLURM_STEP_TASKS_PER_NODE: '2(x2)' names the tasks of 2 node(s), not of node 3"),
      std::string::npos);
  slurm = slurm_step();
  slurm.vars["MASTER_PORT"] = "70000";
  EXPECT_NE(error_of([&] {
              read_launch_environment(slurm.lookup());
            }).find("MASTER_PORT='70000' is not an integer in [1, 65535]"),
            std::string::npos);
}

TEST(SlurmHostlist, Expands) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_hostlist("node1"), V{"node1"});
  EXPECT_EQ(expand_slurm_hostlist("node[01-03,07],gpu5"),
            (V{"node01", "node02", "node03", "node07", "gpu5"}));
  EXPECT_EQ(expand_slurm_hostlist("rack[1-2]-n[8-9]"),
            (V{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(expand_slurm_hostlist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  for (const char* bad : {"", "a,,b", "n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[]"}) {
    EXPECT_NE(error_of([&] { expand_slurm_hostlist(bad); }).find("is malformed"), std::string::npos)
        << bad;
  }
}

TEST(SlurmTasksPerNode, ReadsEachNodesCount) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_NE(error_of([] { slurm_tasks_on_node("2(x3", 0); }).find("tasks-per-node form"),
            std::string::npos);
  EXPECT_NE(error_of([] { slurm_tasks_on_node("x", 0); }).find("the task count='x'"),
            std::string::npos);
}

// Restores the variables configure_threads reads.
class LaunchThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* n : kNames) {
      if (const char* v = std::getenv(n)) saved_[n] = v;
      unsetenv(n);
    }
    threads_ = at::get_num_threads();
  }
  void TearDown() override {
    for (const char* n : kNames) {
      unsetenv(n);
      if (saved_.count(n)) setenv(n, saved_[n].c_str(), 1);
    }
    at::set_num_threads(threads_);
  }
  static constexpr const char* kNames[] = {"OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE"};
  std::map<std::string, std::string> saved_;
  int threads_ = 1;
};

// A world of 16 ranks, 2 per node: each rank gets the cores / 2, not cores / 16.
TEST_F(LaunchThreadsTest, RanksPerNodeDivideTheCores) {
  setenv("RANK", "9", 1);
  setenv("WORLD_SIZE", "16", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  EXPECT_EQ(configure_threads(), std::max(1, cores / 2));
  setenv("OMP_NUM_THREADS", "3", 1);  // the user's choice wins
  EXPECT_EQ(configure_threads(), 3);
}

}  // namespace
}  // namespace te
