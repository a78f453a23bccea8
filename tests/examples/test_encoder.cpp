// te-encoder as a user runs it: short trainings on one process and on every layout (ranks are
// processes started through te-run), whose per-step losses must match one process with the same
// global batch and seed (dropout on: te::nn's dropout does not depend on the layout); the metrics
// and step logs it writes; and every kind of bad input, which must exit 2 with one line naming
// the problem and leave no output file behind.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "run_program.h"

namespace {

namespace fs = std::filesystem;

using Result = te::test::ProgramResult;

// Runs the program with `args` (a shell-quoted string), capturing stdout and stderr apart.
Result encoder(const std::string& args) { return te::test::run_program(TE_ENCODER_PATH, args); }

using te::test::TempDir;

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// The loss column of a --log-steps file.
std::vector<double> losses(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step,epoch,loss,accuracy,samples_per_second");
  std::vector<double> out;
  while (std::getline(in, line)) {
    std::stringstream row(line);
    std::string step, epoch, loss;
    std::getline(row, step, ',');
    std::getline(row, epoch, ',');
    std::getline(row, loss, ',');
    out.push_back(std::stod(loss));
  }
  return out;
}

// A small model (the layouts, not the size, are under test) for 100 steps of one epoch.
const std::string kSmall =
    "--epochs 1 --max-steps 100 --batch-size 32 --max-seq-len 16 --hidden-size 32 "
    "--mlp-hidden-size 64 --heads 4 --mlp-activations gelu,linear --quiet --seed 3";

std::vector<double> run_steps(const TempDir& dir, const std::string& name,
                              const std::string& layout) {
  const fs::path csv = dir / (name + ".csv");
  const Result r = encoder(kSmall + " " + layout + " --log-steps " + csv.string());
  EXPECT_EQ(r.status, 0) << name << ": " << r.err << r.out;
  return losses(csv);
}

// Each layout's 100 per-step losses within 1e-4 (relative) of one process's.
void expect_layouts_match_one_process(
    const std::vector<std::pair<std::string, std::string>>& layouts) {
  TempDir dir;
  const std::vector<double> one = run_steps(dir, "one", "");
  ASSERT_EQ(one.size(), 100u);
  for (const auto& [name, layout] : layouts) {
    const std::vector<double> got = run_steps(dir, name, layout);
    ASSERT_EQ(got.size(), one.size()) << name;
    double worst = 0;
    for (std::size_t i = 0; i < one.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - one[i]) / std::abs(one[i]));
    }
    EXPECT_LT(worst, 1e-4) << name << ": per-step losses differ from one process by up to " << worst
                           << " (relative)";
  }
  // The losses move: a run that did not train would match trivially.
  EXPECT_GT(std::abs(one.front() - one.back()), 1e-3);
}

TEST(Encoder, EveryLayoutMatchesOneProcessStepByStep) {
  expect_layouts_match_one_process({
      {"dp2", "--nproc 2 --mesh data=2 --mesh-resource dp=data"},
      {"fsdp2", "--nproc 2 --mesh data=2 --mesh-resource fsdp=data"},
      {"dp2xtp2", "--nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tpsp=model"},
      {"dp2xtp2_sp",
       "--nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tpsp=model --sequence-parallel"},
      {"tp2_rules",
       "--nproc 2 --mesh model=2 --rules "
       "'heads=model,hidden_tp=model,w_tp=model,my_tp_axis=model'"},
  });
}

// Context parallelism: the padding mask and attention dropout cut per block. (A suite of its own:
// CI runs it on one LibTorch, the code being te's own.)
TEST(EncoderContextParallel, EveryCpLayoutMatchesOneProcessStepByStep) {
  expect_layouts_match_one_process({
      {"cp2_p2p", "--nproc 2 --mesh cp=2 --mesh-resource cp=cp --cp-comm-type p2p"},
      {"dp2xcp2_all_gather",
       "--nproc 4 --mesh data=2,cp=2 --mesh-resource dp=data,cp=cp --cp-comm-type all_gather"},
      {"cp2x2_a2a_p2p",
       "--nproc 4 --mesh ring=2,a2a=2 --rules 'seqlen_cp=(ring,a2a)' --cp-comm-type a2a+p2p"},
  });
}

// TE trains this model in bf16. bf16 compute (fp32 weights and optimiser) must track fp32: the
// mean loss of steps 251-300 of the full-size model within 2%, same seed, batches and masks.
TEST(Encoder, Bf16TracksFp32Over300Steps) {
  TempDir dir;
  // The two trainings run side by side on one thread each (a quarter less wall time on two
  // cores than one after the other on both); the thread count changes no step's expected loss.
  const std::string common = "--epochs 3 --max-steps 300 --quiet --threads 1 --log-steps ";
  std::future<Result> fp32_run =
      std::async(std::launch::async, encoder, common + (dir / "fp32.csv").string());
  const Result bf16_run = encoder(common + (dir / "bf16.csv").string() + " --dtype bf16");
  const Result fp32_done = fp32_run.get();
  ASSERT_EQ(fp32_done.status, 0) << fp32_done.err;
  ASSERT_EQ(bf16_run.status, 0) << bf16_run.err;
  const std::vector<double> fp32 = losses(dir / "fp32.csv"), bf16 = losses(dir / "bf16.csv");
  ASSERT_EQ(fp32.size(), 300u);
  ASSERT_EQ(bf16.size(), 300u);
  double a = 0, b = 0;
  for (std::size_t i = 250; i < 300; ++i) {
    a += fp32[i] / 50;
    b += bf16[i] / 50;
  }
  std::cout << "mean loss of steps 251-300: fp32 " << a << ", bf16 " << b << " ("
            << 100 * (b - a) / a << "%)\n";
  EXPECT_LT(std::abs(b - a), 0.02 * a);
  EXPECT_FALSE(fp32 == bf16);  // bf16 really ran
}

TEST(Encoder, WritesMetricsAndStepLogs) {
  TempDir dir;
  const Result r = encoder(kSmall + " --max-steps 12 --metrics-json " + (dir / "m.json").string() +
                           " --log-steps " + (dir / "s.csv").string() + " --eval-data " +
                           std::string(TE_ENCODER_DATA) + "/in_domain_dev.tsv");
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json m = nlohmann::json::parse(std::ifstream(dir / "m.json"));
  for (const char* key : {"train_loss", "train_accuracy", "dev_loss", "dev_accuracy", "dev_mcc",
                          "seconds", "samples_per_second"}) {
    ASSERT_TRUE(m.contains(key)) << key;
    EXPECT_TRUE(std::isfinite(m[key].get<double>())) << key;
  }
  EXPECT_EQ(m["epochs"], 1);
  EXPECT_EQ(m["steps"], 12);
  EXPECT_EQ(m["world_size"], 1);
  EXPECT_EQ(m["fp8"], "none");
  // The TE commit mirrored, and its defaults (kSmall chooses the activations).
  EXPECT_EQ(m["te_commit"], "d0067d0da");
  EXPECT_EQ(m["intermediate_dropout"], 0.0);
  EXPECT_GE(m["dev_accuracy"].get<double>(), 0.0);
  EXPECT_LE(m["dev_accuracy"].get<double>(), 1.0);
  // --eval-data on the dev file: the same figures as the dev set.
  EXPECT_DOUBLE_EQ(m["eval"]["accuracy"].get<double>(), m["dev_accuracy"].get<double>());
  EXPECT_EQ(losses(dir / "s.csv").size(), 12u);
  EXPECT_FALSE(fs::exists(dir / "m.json.tmp"));
}

// Trained on DP2, saved; loaded on one process and evaluated: the same dev figures.
TEST(Encoder, SavesOnAMeshAndEvaluatesTheCheckpointOnOneProcess) {
  TempDir dir;
  const std::string model = "--max-seq-len 16 --hidden-size 32 --mlp-hidden-size 64 --heads 4 ";
  ASSERT_EQ(encoder(model +
                    "--epochs 1 --max-steps 20 --batch-size 32 --quiet --nproc 2 --mesh "
                    "data=2 --mesh-resource dp=data --save " +
                    (dir / "ckpt").string() + " --metrics-json " + (dir / "train.json").string())
                .status,
            0);
  EXPECT_TRUE(fs::exists(dir / "ckpt/model.safetensors.index.json"));
  const Result r = encoder(model + "--load " + (dir / "ckpt").string() + " --eval-only " +
                           "--metrics-json " + (dir / "eval.json").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("eval: dev_loss"), std::string::npos) << r.out;
  const auto trained = nlohmann::json::parse(std::ifstream(dir / "train.json"));
  const auto evaluated = nlohmann::json::parse(std::ifstream(dir / "eval.json"));
  EXPECT_EQ(evaluated["dev_accuracy"], trained["dev_accuracy"]);
  EXPECT_NEAR(evaluated["dev_loss"].get<double>(), trained["dev_loss"].get<double>(), 1e-5);
  // A model of another size cannot take it.
  const Result wrong = encoder(
      "--max-seq-len 16 --hidden-size 64 --mlp-hidden-size 64 --heads 4 "
      "--eval-only --load " +
      (dir / "ckpt").string());
  EXPECT_EQ(wrong.status, 1) << wrong.err;
  EXPECT_NE(wrong.err.find("in the checkpoint at"), std::string::npos) << wrong.err;
}

// Four steps of a small model: enough to see a run's output and files.
const std::string kFourTinySteps =
    "--epochs 1 --max-steps 4 --batch-size 16 --max-seq-len 16 --hidden-size 32 "
    "--mlp-hidden-size 64 --heads 4 ";

TEST(Encoder, PrintsEpochLinesAndFp8Runs) {
  TempDir dir;
  const Result r = encoder(kFourTinySteps +
                           "--fp8 delayed "
                           "--metrics-json " +
                           (dir / "m.json").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("fp8 delayed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("epoch 1: train_loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" dev_mcc "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("metrics: " + (dir / "m.json").string()), std::string::npos) << r.out;
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir / "m.json"))["fp8"], "delayed");
}

// FP8 weights in training: the kernels held as codes, cast again after every step (the run
// would stop at the second step's forward otherwise), the held bytes printed; metrics say so.
TEST(Encoder, QuantizedWeightsTrain) {
  TempDir dir;
  const Result r = encoder(kFourTinySteps +
                           "--fp8 current --quantized-weights "
                           "--metrics-json " +
                           (dir / "m.json").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("quantized weights: 7 GEMM kernels held as E4M3 codes"), std::string::npos)
      << r.out;
  const auto m = nlohmann::json::parse(std::ifstream(dir / "m.json"));
  EXPECT_EQ(m["quantized_weights"], true);
  EXPECT_EQ(m["steps"], 4);
}

TEST(Encoder, HelpDescribesEveryOption) {
  const Result r = encoder("--help");
  EXPECT_EQ(r.status, 0);
  for (const char* opt : {"--data",
                          "--eval-data",
                          "--epochs",
                          "--batch-size",
                          "--max-seq-len",
                          "--lr",
                          "--seed",
                          "--dropout",
                          "--fp8",
                          "--mesh",
                          "--mesh-resource",
                          "--rules",
                          "--extend-te-rules",
                          "--sequence-parallel",
                          "--cp-comm-type",
                          "--nproc",
                          "--metrics-json",
                          "--log-steps",
                          "--threads",
                          "--device",
                          "--intermediate-dropout",
                          "--quantized-weights"}) {
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
  }
  // The TE commit it mirrors.
  EXPECT_NE(r.out.find("examples/jax/encoder at commit d0067d0da"), std::string::npos) << r.out;
  // Every registered FP8 recipe, with what it is.
  EXPECT_NE(r.out.find("none,delayed,current,block,mxfp8,nvfp4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mxfp8 (MXFP8BlockScaling: E8M0 scales per 1x32 block"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("nvfp4 (NVFP4BlockScaling: E2M1 with E4M3 scales"), std::string::npos)
      << r.out;
}

// Bad input: exit code 2, one line on stderr that names the culprit, no output files.
void expect_rejected(const std::string& args, const std::string& words) {
  TempDir dir;
  const Result r = encoder(args + " --metrics-json " + (dir / "m.json").string() + " --log-steps " +
                           (dir / "s.csv").string());
  EXPECT_EQ(r.status, 2) << args << "\n" << r.err << r.out;
  EXPECT_NE(r.err.find(words), std::string::npos) << args << "\nstderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(fs::is_empty(dir.path())) << args << " left files behind";
}

TEST(EncoderBadInput, MissingDataDirectory) {
  expect_rejected("--data /nonexistent/cola", "--data '/nonexistent/cola' is not a directory");
}

TEST(EncoderBadInput, DirectoryWithoutColaFiles) {
  TempDir data;
  expect_rejected("--data " + data.path().string(), "holds neither in_domain_train.tsv");
}

TEST(EncoderBadInput, MalformedLineIsNamedWithFileAndLine) {
  TempDir data;
  write(data / "train.tsv", "src\t1\t\tA fine sentence.\nsrc\t1\tonly three columns\n");
  write(data / "dev.tsv", "src\t0\t*\tSentence fine a.\n");
  expect_rejected("--data " + data.path().string(),
                  (data / "train.tsv").string() + ":2: expected 4 tab-separated columns");
}

TEST(EncoderBadInput, LabelOtherThanZeroOrOne) {
  TempDir data;
  write(data / "train.tsv", "src\t1\t\tA fine sentence.\n");
  write(data / "dev.tsv", "src\t0\t*\tOne.\nsrc\tyes\t\tTwo.\n");
  expect_rejected("--data " + data.path().string(),
                  (data / "dev.tsv").string() + ":2: label 'yes' is not 0 or 1");
}

TEST(EncoderBadInput, EmptyDataFile) {
  TempDir data;
  write(data / "train.tsv", "");
  write(data / "dev.tsv", "src\t0\t*\tOne.\n");
  expect_rejected("--data " + data.path().string(), "holds no examples");
}

TEST(EncoderBadInput, MissingEvalFile) {
  expect_rejected("--eval-data /nonexistent.tsv", "cannot read data file '/nonexistent.tsv'");
}

TEST(EncoderBadInput, UnknownOptionValues) {
  expect_rejected("--fp8 hybrid", "--fp8");
  expect_rejected("--mlp-activations gelu,swish", "'swish'");
  expect_rejected("--intermediate-dropout 1.5", "--intermediate-dropout");
  expect_rejected("--mesh data=two", "size 'two' of axis 'data' is not a positive integer");
  expect_rejected("--mesh-resource dq=data", "dq");
  expect_rejected("--rules 'batch=(data'", "--rules");
}

// --device cuda where LibTorch has no CUDA or no GPU is visible (this CI machine); on a GPU
// machine the run would go ahead, so the test only applies where there is none.
TEST(EncoderBadInput, CudaDeviceWithoutAGpu) {
  expect_rejected("--device tpu", "--device");
  if (fs::exists("/dev/nvidiactl")) GTEST_SKIP() << "an NVIDIA driver is here";
  expect_rejected("--device cuda --max-steps 1",
                  "--device cuda: this LibTorch has no CUDA, or no GPU is visible");
}

TEST(EncoderBadInput, RulesNameAMeshAxisTheMeshLacks) {
  expect_rejected("--nproc 2 --mesh data=2 --rules batch=model",
                  "--rules entry 'batch=model' names mesh axis 'model', which the mesh "
                  "(data=2) lacks");
  expect_rejected("--nproc 2 --mesh data=2 --mesh-resource dp=data,tp=model",
                  "--mesh-resource names mesh axis 'model'");
}

TEST(EncoderBadInput, CpCommTypeWithoutACpAxis) {
  expect_rejected("--nproc 2 --mesh data=2 --mesh-resource dp=data --cp-comm-type p2p",
                  "--cp-comm-type p2p: the layout (");
  expect_rejected("--cp-comm-type ring", "--cp-comm-type: ring not in {p2p,all_gather,a2a,a2a+p2p}");
}

TEST(EncoderBadInput, MeshSizeDiffersFromWorldSize) {
  expect_rejected("--mesh data=4", "--mesh data=4 has 4 ranks but the world has 1");
  expect_rejected("--nproc 2 --mesh data=2,model=2 --mesh-resource dp=data",
                  "has 4 ranks but the world has 2");
}

TEST(EncoderBadInput, BatchNotDivisibleByDataParallelSize) {
  expect_rejected("--nproc 2 --mesh data=2 --mesh-resource dp=data --batch-size 63",
                  "--batch-size 63 (the global batch) is not divisible by the data-parallel "
                  "size 2");
}

TEST(EncoderBadInput, EvalOnlyWithoutACheckpoint) {
  expect_rejected("--eval-only", "--eval-only needs --load DIR");
  expect_rejected("--load /nonexistent --eval-only", "--load '/nonexistent' holds no checkpoint");
}

TEST(EncoderBadInput, QuantizedWeightsNeedAPerTensorRecipe) {
  expect_rejected("--quantized-weights",
                  "--quantized-weights holds the kernels with a per-tensor "
                  "FP8 recipe; add --fp8 current (or delayed)");
  expect_rejected("--quantized-weights --fp8 mxfp8", "not --fp8 mxfp8 (it scales blocks)");
}

TEST(EncoderBadInput, MeshWithoutAnythingMappingOntoIt) {
  expect_rejected("--nproc 2 --mesh data=2", "needs --mesh-resource or --rules");
}

}  // namespace
