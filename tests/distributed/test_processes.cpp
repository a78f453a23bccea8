// Ranks as processes: te-run starts them, init_distributed joins them over a TCP store on
// loopback. Checks values across processes, the launcher's contract, and faults.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>

#include "../temp_dir.h"

namespace {

using te::test::TempDir;

struct Result {
  int status = -1;
  std::string output;
  double seconds = 0;
};

Result run(const std::string& command) {
  Result r;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) r.output += buf.data();
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

const std::string kRun = TE_RUN_PATH;
const std::string kWorker = TE_WORKER_PATH;

// What follows `head` on the output line that has it; empty when no line has it.
std::string rest_of_line(const std::string& output, const std::string& head) {
  const auto at = output.find(head);
  if (at == std::string::npos) return std::string();
  const auto from = at + head.size();
  return output.substr(from, output.find('\n', from) - from);
}

// Loads the checkpoint at `dir` into the worker's layer (ckpt_sum), started as
// `env te-run options`, and expects the fingerprint `sum` of its weights.
void expect_loads_with_sum(const std::string& dir, const std::string& sum,
                           const std::string& env = "", const std::string& options = "--nproc 1") {
  const Result load = run(env + kRun + " " + options + " -- " + kWorker + " ckpt_sum " + dir);
  ASSERT_EQ(load.status, 0) << load.output;
  EXPECT_NE(load.output.find("loaded checkpoint sum " + sum), std::string::npos)
      << env << options << ": saved " << sum << "\n"
      << load.output;
}

TEST(Processes, TwoAndFourRanksAgreeWithOneProcessMath) {
  for (int n : {2, 4}) {
    const Result r = run(kRun + " --nproc " + std::to_string(n) + " -- " + kWorker + " check");
    EXPECT_EQ(r.status, 0) << r.output;
    for (int k = 0; k < n; ++k) {
      const std::string line = "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                               " of " + std::to_string(n) + " ok";
      EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
    }
  }
}

// The DP2xTP2 TransformerLayer case of the equivalence matrix, in training with dropout, as four
// processes: output and every gradient equal the same layer on one process.
TEST(Processes, TransformerLayerWithDropoutOnDp2xTp2MatchesOneProcess) {
  const Result r = run(kRun + " --nproc 4 -- " + kWorker + " layer");
  EXPECT_EQ(r.status, 0) << r.output;
  for (int k = 0; k < 4; ++k) {
    const std::string line =
        "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " layer ok (8 gradients)";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
}

// Ranks 0 and 1 finish while rank 2 still talks to the store rank 0 hosts: rank 0 waits for it
// (before, rank 2 failed with 'Broken pipe' once rank 0 had exited).
TEST(Processes, RanksThatFinishEarlyDoNotCutOffOneStillUsingTheStore) {
  const Result r = run(kRun + " --nproc 3 -- " + kWorker + " early_exit");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] rank 2 used the store after its peers finished"),
            std::string::npos)
      << r.output;
}

// The NCCL unique id travels between processes through the world's TCP store (the GPU part of
// making a communicator is scripts/gpu-check.sh's).
TEST(Processes, NcclUniqueIdIsSharedThroughTheStore) {
  const Result r = run(kRun + " --nproc 3 -- " + kWorker + " nccl_id");
  ASSERT_EQ(r.status, 0) << r.output;
  if (r.output.find("nccl not built") != std::string::npos) GTEST_SKIP() << "built without NCCL";
  for (int k = 0; k < 3; ++k) {
    const std::string line =
        "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " nccl id shared by 3 ranks";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
}

TEST(Processes, Fp8DataParallelStepsAgreeWithOneProcessAndAcrossRanks) {
  const Result r = run(kRun + " --nproc 2 -- " + kWorker + " fp8");
  ASSERT_EQ(r.status, 0) << r.output;
  // Each rank prints its scales; they must be the same text.
  std::string scales[2];
  for (int k = 0; k < 2; ++k) {
    const std::string head =
        "[rank " + std::to_string(k) + "] rank " + std::to_string(k) + " fp8 ok scales";
    ASSERT_NE(r.output.find(head), std::string::npos) << r.output;
    scales[k] = rest_of_line(r.output, head);
  }
  EXPECT_EQ(scales[0], scales[1]);
  EXPECT_NE(scales[0].find("wi_fp8_fwd_scale="), std::string::npos) << scales[0];
}

TEST(Processes, AKilledRankIsNamedByTheSurvivorsWithinTheTimeout) {
  const Result r =
      run("TE_DIST_TIMEOUT_S=20 " + kRun + " --nproc 3 --grace 15 -- " + kWorker + " die");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("te-run: rank 1 was killed by signal 9; stopping the other ranks"),
            std::string::npos)
      << r.output;
  for (int k : {0, 2}) {
    const std::string line = "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                             " error: all_reduce over mesh axis 'x' (ranks [0, 1, 2]) failed on "
                             "rank " +
                             std::to_string(k) + ": missing rank 1 stopped responding";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
  EXPECT_LT(r.seconds, 20.0) << r.output;
}

// A rank killed in the middle of a save: the survivors fail with the missing rank named, and the
// previous checkpoint is still there, whole, and loads with the weights it was saved with.
TEST(Processes, ARankKilledDuringASaveLeavesThePreviousCheckpoint) {
  const TempDir root("te_ckpt_kill");
  const std::string dir = root / "ckpt";
  const Result r = run("TE_DIST_TIMEOUT_S=10 " + kRun + " --nproc 2 --grace 15 -- " + kWorker +
                       " ckpt_kill " + dir);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("te-run: rank 1 was killed by signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] rank 0 error: "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("second save returned"), std::string::npos) << r.output;
  const std::string first = rest_of_line(r.output, "[rank 0] first checkpoint sum ");
  ASSERT_FALSE(first.empty()) << r.output;
  expect_loads_with_sum(dir, first);
}

// Trained and saved by 4 processes on DP2xTP2; loaded by 1 process, and by 2 processes on TP2
// and on FSDP2: every parameter and buffer bit for bit (a fingerprint of all their bytes).
TEST(Processes, ACheckpointSavedOnDp2xTp2LoadsBitForBitOnOtherMeshes) {
  const TempDir root("te_ckpt_mesh");
  const std::string dir = root / "ckpt";
  const Result save = run(kRun + " --nproc 4 -- " + kWorker + " ckpt_save4 " + dir);
  ASSERT_EQ(save.status, 0) << save.output;
  const std::string saved = rest_of_line(save.output, "[rank 0] saved checkpoint sum ");
  ASSERT_FALSE(saved.empty()) << save.output;
  expect_loads_with_sum(dir, saved);
  expect_loads_with_sum(dir, saved, "TE_CKPT_ROLES=tp=x ", "--nproc 2");
  expect_loads_with_sum(dir, saved, "TE_CKPT_ROLES=fsdp=x ", "--nproc 2");
}

// Fault injection: a rank killed inside a tensor-parallel model's forward, and inside its
// backward (from a gradient hook). The survivor is in a collective of the next layer; it names
// the dead rank well within the timeout, and never finishes the step.
TEST(Processes, ARankKilledInForwardOrBackwardIsNamedByTheSurvivor) {
  for (const std::string where : {"forward", "backward"}) {
    const Result r = run("TE_DIST_TIMEOUT_S=20 " + kRun + " --nproc 2 --grace 15 -- " + kWorker +
                         " fault " + where);
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("te-run: rank 1 was killed by signal 9"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("[rank 0] rank 0 ran the first layer"), std::string::npos) << r.output;
    if (where == "forward") {
      EXPECT_EQ(r.output.find("ran the second layer"), std::string::npos) << r.output;
    } else {
      EXPECT_NE(r.output.find("[rank 1] rank 1 dies in backward"), std::string::npos) << r.output;
    }
    EXPECT_NE(r.output.find("[rank 0] rank 0 error: all_reduce over mesh axis 'model' (ranks [0, "
                            "1]) failed on rank 0: missing rank 1 stopped responding"),
              std::string::npos)
        << where << "\n"
        << r.output;
    EXPECT_EQ(r.output.find("finished the step"), std::string::npos) << r.output;
    EXPECT_LT(r.seconds, 20.0) << where << "\n" << r.output;
  }
}

// Ranks that build different meshes: every rank names both meshes at once, long before the
// rows that would never connect time out.
TEST(Processes, RanksThatBuildDifferentMeshesAreNamedAtOnce) {
  const Result r =
      run("TE_DIST_TIMEOUT_S=60 " + kRun + " --nproc 2 --grace 15 -- " + kWorker + " fault mesh");
  EXPECT_EQ(r.status, 4) << r.output;
  for (int k : {0, 1}) {
    const std::string line = "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                             " error: DeviceMesh #0 differs between ranks: rank(s) 0 built "
                             "DeviceMesh(data=2); rank(s) 1 built DeviceMesh(model=2)";
    EXPECT_NE(r.output.find(line), std::string::npos) << r.output;
  }
  EXPECT_EQ(r.output.find("built its mesh"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
}

// A rank that skips a constraint (rank 0 gathers the output for its loss, rank 1 does not and
// goes on to the gradient all-reduce): under TE_CHECK_COLLECTIVES=1 both ranks stop naming both
// calls. (Without the check, what happens depends on the sizes; here Gloo aborts rank 0 from
// its own I/O thread on the mismatched byte counts, and rank 1 names rank 0 as gone.)
TEST(Processes, ARankThatSkipsAConstraintIsCaughtByTheCollectiveCheck) {
  const Result r = run("TE_CHECK_COLLECTIVES=1 TE_DIST_TIMEOUT_S=20 " + kRun +
                       " --nproc 2 --grace 15 -- " + kWorker + " fault skip");
  EXPECT_EQ(r.status, 4) << r.output;
  for (int k : {0, 1}) {
    const std::string head = "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                             " error: collectives out of step over mesh axis 'data' (ranks [0, 1])";
    const auto at = r.output.find(head);
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(line.find("all_gather(dim 0) of Float [4, 6, 16], collective #1"), std::string::npos)
        << line;
    EXPECT_NE(line.find("all_reduce(sum) of Float ["), std::string::npos) << line;
  }
  EXPECT_EQ(r.output.find("finished the step"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20.0) << r.output;
}

// A full disk during a save, as a file-size limit (ulimit -f, SIGXFSZ ignored so write() fails
// with EFBIG): each rank names the file it could not write, and the previous checkpoint is
// still there, whole, with the weights it was saved with.
TEST(Processes, AFullDiskDuringASaveLeavesThePreviousCheckpoint) {
  const TempDir root("te_ckpt_full");
  const std::string dir = root / "ckpt";
  const Result first = run(kRun + " --nproc 2 -- " + kWorker + " ckpt_write " + dir + " 1");
  ASSERT_EQ(first.status, 0) << first.output;
  const std::string saved = rest_of_line(first.output, "[rank 0] saved checkpoint sum ");
  ASSERT_FALSE(saved.empty()) << first.output;
  // 64 blocks of 512 bytes: 32 KiB, less than either rank's file (about 100 and 150 KB).
  const Result full =
      run("sh -c \"trap '' XFSZ; ulimit -f 64; exec env TE_DIST_TIMEOUT_S=20 " + kRun +
          " --nproc 2 --grace 15 -- " + kWorker + " ckpt_write " + dir + " 2\"");
  EXPECT_EQ(full.status, 4) << full.output;
  for (int k : {0, 1}) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05d-of-00002.safetensors", k + 1);
    const std::string line = "[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                             " error: checkpoint: writing '" + dir + ".saving/" + file +
                             "' failed: File too large; make room there";
    EXPECT_NE(full.output.find(line), std::string::npos) << full.output;
  }
  EXPECT_EQ(full.output.find("saved checkpoint sum"), std::string::npos) << full.output;
  expect_loads_with_sum(dir, saved);
}

TEST(Processes, LauncherStopsTheOthersAndReturnsTheFailedStatus) {
  // Rank 1 exits 7 while ranks 0 and 2 wait in a collective; with a short grace they are
  // stopped (or fail on their own) and te-run returns 7.
  const Result r =
      run("TE_DIST_TIMEOUT_S=60 " + kRun + " --nproc 3 --grace 1 -- " + kWorker + " exit 7");
  EXPECT_EQ(r.status, 7) << r.output;
  EXPECT_NE(r.output.find("te-run: rank 1 exited with status 7"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30.0) << r.output;
}

TEST(Processes, ARankThatNeverJoinsIsNamed) {
  // Only rank 0 of 2 starts: it hosts the store and waits for rank 1 until the timeout.
  const Result r =
      run("RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29731 "
          "TE_DIST_TIMEOUT_S=2 " +
          kWorker + " check");
  EXPECT_EQ(r.status, 4) << r.output;
  EXPECT_NE(r.output.find("rank 0: rank(s) 1 of 2 did not join within 2 s"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 15.0);
}

TEST(Processes, MissingEnvironmentIsReported) {
  const Result r = run("env -u RANK -u WORLD_SIZE " + kWorker + " check");
  EXPECT_EQ(r.status, 4) << r.output;
  EXPECT_NE(r.output.find("RANK and WORLD_SIZE"), std::string::npos) << r.output;
  const Result bad = run("RANK=3 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 " + kWorker);
  EXPECT_NE(bad.output.find("RANK='3' is not an integer in [0, 1]"), std::string::npos)
      << bad.output;
}

TEST(Processes, LauncherPrefixesAndPassesArguments) {
  const Result r = run(kRun +
                       " --nproc 2 -- sh -c 'echo rank=$RANK of $WORLD_SIZE local=$LOCAL_RANK "
                       "at $MASTER_ADDR:$MASTER_PORT'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] rank=0 of 2 local=0 at 127.0.0.1:"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank 1] rank=1 of 2 local=1 at 127.0.0.1:"), std::string::npos)
      << r.output;
  const Result missing = run(kRun + " --nproc 1 -- /nonexistent/program");
  EXPECT_EQ(missing.status, 127) << missing.output;
  EXPECT_NE(missing.output.find("cannot run /nonexistent/program"), std::string::npos);
}

// A port in [lo, lo + 9999] nobody listens on now (SLURM's derived port lives in 20000-29999).
int free_port_from(int lo) {
  for (int i = 0; i < 10000; ++i) {
    const int port = lo + (getpid() + i * 7) % 10000;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) return port;
  }
  return -1;
}

// srun's variables, set by hand on one host: two tasks of a one-node step find the master (the
// step's first host) and the port (from the job id) as every task of the job would.
TEST(Processes, SlurmVariablesStartAWorld) {
  const int port = free_port_from(20000);
  ASSERT_GT(port, 0);
  // srun's port: 20000 + (SLURM_JOB_ID % 1000) * 10 + SLURM_STEP_ID % 10.
  const std::string job = std::to_string((port - 20000) / 10 + 1000 * 42);
  const std::string step = std::to_string((port - 20000) % 10);
  std::string cmd;
  for (int k = 0; k < 2; ++k) {
    cmd += "env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT SLURM_PROCID=" +
           std::to_string(k) +
           " SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_LOCALID=" + std::to_string(k) +
           " SLURM_NODEID=0 SLURM_NNODES=1 SLURM_STEP_TASKS_PER_NODE=2 "
           "SLURM_STEP_NODELIST=127.0.0.[1] SLURM_JOB_NODELIST=127.0.0.1 SLURM_JOB_ID=" +
           job + " SLURM_STEP_ID=" + step + " " + kWorker + " launch & ";
  }
  const Result r = run("TE_DIST_TIMEOUT_S=30 sh -c '" + cmd + "wait'");
  for (int k = 0; k < 2; ++k) {
    const std::string rank = std::to_string(k);
    EXPECT_NE(r.output.find("rank " + rank + " joined: slurm environment: rank " + rank +
                            " of 2, local rank " + rank +
                            " of 2 on node 0 of 1, master 127.0.0.1 (the first host of "
                            "SLURM_STEP_NODELIST):" +
                            std::to_string(port) +
                            " (SLURM_JOB_ID and SLURM_STEP_ID); Gloo binds 127.0.0.1 (chosen by "
                            "127.0.0.1 (the first host of SLURM_STEP_NODELIST) (a loopback "
                            "address))"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("rank " + rank + " of 2 ok"), std::string::npos) << r.output;
  }
}

// Two te-runs, as two nodes would run them (here both on loopback): node K starts ranks
// 2K and 2K+1 of 4 with torchrun's variables, and the four make one world.
TEST(Processes, TeRunJoinsAWorldOfSeveralNodes) {
  const int port = free_port_from(30000);
  ASSERT_GT(port, 0);
  std::string cmd;
  for (int node = 0; node < 2; ++node) {
    cmd += kRun + " --nnodes 2 --node-rank " + std::to_string(node) +
           " --nproc-per-node 2 --master-addr 127.0.0.1 --master-port " + std::to_string(port) +
           " -- " + kWorker + " launch & ";
  }
  const Result r = run("TE_DIST_TIMEOUT_S=30 sh -c '" + cmd + "wait'");
  for (int k = 0; k < 4; ++k) {
    const std::string rank = std::to_string(k);
    EXPECT_NE(r.output.find("[rank " + rank + "] rank " + rank +
                            " joined: torchrun environment: "
                            "rank " +
                            rank + " of 4, local rank " + std::to_string(k % 2) + " of 2 on node " +
                            std::to_string(k / 2) + " of 2, master 127.0.0.1"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("[rank " + rank + "] rank " + rank + " of 4 ok"), std::string::npos)
        << r.output;
  }
  const Result env = run(kRun +
                         " --nnodes 3 --node-rank 2 --nproc-per-node 2 --master-addr h0 "
                         "--master-port 4000 -- sh -c 'echo $RANK $WORLD_SIZE $LOCAL_RANK "
                         "$LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT'");
  EXPECT_NE(env.output.find("[rank 5] 5 6 1 2 2 h0 4000"), std::string::npos) << env.output;
}

TEST(Processes, TeRunRefusesAnIncompleteMultiNodeCommand) {
  const std::pair<const char*, const char*> cases[] = {
      {"--nnodes 2 --node-rank 1 --nproc-per-node 1",
       "te-run: --nnodes 2 needs --master-addr and --master-port"},
      {"--nnodes 2048 --nproc-per-node 1024 --master-addr h --master-port 1",
       "ranks is more than a world holds (1048576)"},
      {"--nnodes 2 --node-rank 2 --nproc 1", "te-run: --node-rank 2 is not a node of --nnodes 2"},
  };
  for (const auto& [options, words] : cases) {
    const Result r = run(kRun + " " + options + " -- true");
    EXPECT_EQ(r.status, 2) << options << "\n" << r.output;
    EXPECT_NE(r.output.find(words), std::string::npos) << options << "\n" << r.output;
  }
}

}  // namespace
