// te-train as a user runs it: a small Llama from a config on a text file, resumed after an
// interruption with the same losses bit for bit (one process in bf16 with fp32 masters, and
// DP2xTP2 and DP2 with ZeRO-1 ranks as processes through te-run), each equal to one process,
// every FP8 recipe training as fp32 does, the outputs it writes (MFU among them), and every kind
// of bad input, which exits 2 with one line naming the option or the file and leaves a good
// checkpoint as it was; a run killed during a save resumes from the checkpoint before it.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../temp_dir.h"
#include "run_program.h"

namespace {

namespace fs = std::filesystem;
using te::test::TempDir;

using Result = te::test::ProgramResult;

// Runs the program with `args` (a shell-quoted string), capturing stdout and stderr apart.
Result te_train(const std::string& args) { return te::test::run_program(TE_TRAIN_PATH, args); }

// The step,loss,grad_norm,lr columns of a --log-steps file, as written (text: bit for bit); the
// timings after them differ from run to run.
std::vector<std::string> steps_of(const fs::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step,loss,grad_norm,lr,tokens_per_second,mfu,peak_flops");
  std::vector<std::string> out;
  while (std::getline(in, line)) {
    std::size_t end = 0;
    for (int column = 0; column < 4 && end != std::string::npos; ++column) {
      end = line.find(',', end + (column > 0 ? 1 : 0));
    }
    out.push_back(line.substr(0, end));
  }
  return out;
}

double loss_of(const std::string& row) {
  std::stringstream s(row);
  std::string step, loss;
  std::getline(s, step, ',');
  std::getline(s, loss, ',');
  return std::stod(loss);
}

class Train : public ::testing::Test {
 protected:
  void SetUp() override {
    // A Llama sized for the test's tokenizer (SmolLM2's kind, cut to 400 tokens), tied head.
    const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                   {"model_type", "llama"},
                                   {"vocab_size", 420},
                                   {"hidden_size", 64},
                                   {"num_hidden_layers", 2},
                                   {"num_attention_heads", 4},
                                   {"num_key_value_heads", 2},
                                   {"intermediate_size", 128},
                                   {"max_position_embeddings", 256},
                                   {"rms_norm_eps", 1e-6},
                                   {"tie_word_embeddings", true},
                                   {"eos_token_id", 0}};
    std::ofstream(dir_ / "config.json") << config.dump();
    // A text that stays put (CoLA's vendored dev sentences, each a paragraph: a document): the
    // losses the layouts are held to must not move when a document of ours is edited. (With
    // README.md as the corpus, a reworded paragraph moved DP2xTP2's step 12 to 3.2e-6 of one
    // process's, over the 1e-6 bound.)
    std::ifstream cola(std::string(TE_SOURCE_DIR) +
                       "/examples/encoder/data/cola/in_domain_dev.tsv");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (std::string line; std::getline(cola, line);) corpus << line << "\n\n";
  }
  // The run: 12 steps of two micro-batches of 4 rows of 32 tokens, warmup 3, cosine.
  std::string args(const std::string& extra, const std::string& data = "corpus.txt",
                   const std::string& config = "config.json") const {
    return "--config " + (dir_ / config).string() + " --tokenizer " + TE_SOURCE_DIR +
           "/fuzz/corpus/tokenizer/tokenizer-bpe.json --data " + (dir_ / data).string() +
           " --steps 12 --seq-len 32 --micro-batch 4 --global-batch-tokens 256 --lr 3e-3 "
           "--warmup 3 --quiet " +
           extra;
  }
  // An interrupted run (--max-steps 5, saved) resumed to the end: its steps 6-12 are the
  // uninterrupted run's, bit for bit.
  void expect_resume_bit_for_bit(const std::string& extra) {
    const std::string ck = (dir_ / "ck").string();
    ASSERT_EQ(te_train(args(extra + " --log-steps " + (dir_ / "whole.csv").string())).status, 0);
    Result first = te_train(args(extra + " --max-steps 5 --save " + ck));
    ASSERT_EQ(first.status, 0) << first.err;
    Result rest = te_train(
        args(extra + " --resume --save " + ck + " --log-steps " + (dir_ / "rest.csv").string()));
    ASSERT_EQ(rest.status, 0) << rest.err;
    const std::vector<std::string> whole = steps_of(dir_ / "whole.csv");
    const std::vector<std::string> resumed = steps_of(dir_ / "rest.csv");
    ASSERT_EQ(whole.size(), 12u);
    ASSERT_EQ(resumed.size(), 7u);
    for (std::size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], whole[i + 5]);
    EXPECT_LT(loss_of(whole.back()), loss_of(whole.front()));
  }
  std::string logged(const std::string& extra, const std::string& csv) {
    return extra + " --log-steps " + (dir_ / csv).string();
  }
  TempDir dir_{"te_train"};
};

TEST_F(Train, ResumeInBf16IsBitForBit) { expect_resume_bit_for_bit("--dtype bf16"); }

// A run killed after its save at step 5 (here: stopped at 7, saved at 5) and resumed with the same
// --log-steps file: the file holds steps 1-12 once each, as the uninterrupted run's.
TEST_F(Train, ResumeKeepsTheStepLogUpToTheCheckpoint) {
  const std::string ck = (dir_ / "ck").string();
  ASSERT_EQ(te_train(args(logged("", "whole.csv"))).status, 0);
  ASSERT_EQ(te_train(args(logged("--max-steps 5 --save " + ck, "log.csv"))).status, 0);
  const std::string saved = (dir_ / "ck5").string();
  std::filesystem::copy(ck, saved, std::filesystem::copy_options::recursive);
  ASSERT_EQ(te_train(args(logged("--resume --max-steps 7 --save " + ck, "log.csv"))).status, 0);
  std::filesystem::remove_all(ck);
  std::filesystem::rename(saved, ck);  // the last good checkpoint: step 5
  ASSERT_EQ(te_train(args(logged("--resume --save " + ck, "log.csv"))).status, 0);
  EXPECT_EQ(steps_of(dir_ / "log.csv"), steps_of(dir_ / "whole.csv"));
}

// A kill during a save leaves the last good checkpoint: te-train saving after every step is killed
// (SIGKILL) as a save begins, and again as a save's index is being written (the moment before the
// new checkpoint is put in place); each time --resume continues from the checkpoint that was in
// place and the steps after it are the uninterrupted run's, bit for bit.
TEST_F(Train, AKillDuringASaveLeavesTheLastGoodCheckpoint) {
  ASSERT_EQ(te_train(args(logged("", "whole.csv"))).status, 0);
  const std::vector<std::string> whole = steps_of(dir_ / "whole.csv");
  ASSERT_EQ(whole.size(), 12u);
  const fs::path ck = dir_ / "ck", saving = dir_ / "ck.saving";
  const std::string index = "model.safetensors.index.json";
  for (const fs::path& cue : {saving, saving / index}) {
    bool mid_save = false;  // the kill landed before the save was in place
    for (int attempt = 0; attempt < 5 && !mid_save; ++attempt) {
      fs::remove_all(ck);
      fs::remove_all(saving);
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        const std::string cmd = std::string("exec ") + TE_TRAIN_PATH + " " +
                                args("--save-every 1 --save " + ck.string()) +
                                " >/dev/null 2>&1 </dev/null";
        ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      // Past the first save (a checkpoint is in place), then at the cue of a later one.
      int status = 0;
      bool exited = false;
      for (const fs::path& wait_for : {ck / index, cue}) {
        while (!exited && !fs::exists(wait_for)) {
          exited = ::waitpid(pid, &status, WNOHANG) == pid;
          std::this_thread::yield();
        }
      }
      if (!exited) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
      }
      mid_save = WIFSIGNALED(status) && fs::exists(saving);
    }
    ASSERT_TRUE(mid_save) << cue << ": no kill landed during a save in 5 runs";
    const fs::path rest = dir_ / "rest.csv";
    fs::remove(rest);
    const Result r =
        te_train(args("--resume --save " + ck.string() + " --log-steps " + rest.string()));
    ASSERT_EQ(r.status, 0) << cue << ": " << r.err;
    const std::vector<std::string> resumed = steps_of(rest);
    ASSERT_GE(resumed.size(), 1u) << cue;
    ASSERT_LE(resumed.size(), 11u) << cue << ": resumed from before the first save";
    for (std::size_t i = 0; i < resumed.size(); ++i) {
      EXPECT_EQ(resumed[i], whole[whole.size() - resumed.size() + i]) << cue;
    }
  }
}

// Packed documents (THD rows): trains, and resumes bit for bit.
TEST_F(Train, PackedResumesBitForBit) { expect_resume_bit_for_bit("--pack"); }

// float16 weights with fp32 masters and dynamic loss scaling: an initial scale of 2^24 overflows
// the first six steps (skipped, the scale halved each time), so the resumed run must take the
// scale from the checkpoint to skip what the uninterrupted run skipped.
TEST_F(Train, ResumeInFp16IsBitForBit) {
  expect_resume_bit_for_bit("--dtype fp16 --loss-scale 16777216");
  const std::string m = (dir_ / "m.json").string();
  ASSERT_EQ(te_train(args("--dtype fp16 --loss-scale 16777216 --metrics-json " + m)).status, 0);
  EXPECT_GE(nlohmann::json::parse(std::ifstream(m))["skipped_steps"].get<int>(), 3);
}

// Every recipe of --fp8 trains the model as fp32 does: each step's loss within 1% of the fp32
// run's for the FP8 recipes (measured: at most 0.26% in fp32, 0.5% in bf16) and 5% for NVFP4's
// 4-bit codes (measured: 2.9%), falling by more than 0.5 over the 12 steps.
TEST_F(Train, Fp8RecipesTrainAsFp32Does) {
  ASSERT_EQ(te_train(args("--log-steps " + (dir_ / "fp32.csv").string())).status, 0);
  const std::vector<std::string> fp32 = steps_of(dir_ / "fp32.csv");
  ASSERT_EQ(fp32.size(), 12u);
  for (const std::string extra : {"--fp8 delayed", "--fp8 current", "--fp8 block", "--fp8 mxfp8",
                                  "--fp8 nvfp4", "--fp8 delayed --dtype bf16"}) {
    const fs::path csv = dir_ / "fp8.csv";
    const Result r = te_train(args(extra + " --log-steps " + csv.string()));
    ASSERT_EQ(r.status, 0) << extra << ": " << r.err;
    const std::vector<std::string> fp8 = steps_of(csv);
    ASSERT_EQ(fp8.size(), fp32.size()) << extra;
    const double bound = extra == std::string("--fp8 nvfp4") ? 0.05 : 0.01;
    for (std::size_t i = 0; i < fp8.size(); ++i) {
      EXPECT_TRUE(std::isfinite(loss_of(fp8[i]))) << extra << " step " << i + 1;
      EXPECT_NEAR(loss_of(fp8[i]), loss_of(fp32[i]), bound * loss_of(fp32[i]))
          << extra << " step " << i + 1;
    }
    EXPECT_LT(loss_of(fp8.back()), loss_of(fp8.front()) - 0.5) << extra;
  }
}

TEST_F(Train, WritesMetricsEvaluationAndHuggingFaceFiles) {
  const std::string out = (dir_ / "hf").string();
  Result r = te_train(args("--eval-fraction 0.1 --eval-every 6 --export-hf " + out +
                           " --peak-tflops 1000 --metrics-json " + (dir_ / "m.json").string() +
                           " --log-steps " + (dir_ / "steps.csv").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto m = nlohmann::json::parse(std::ifstream(dir_ / "m.json"));
  EXPECT_EQ(m["steps_run"], 12);
  // MFU against the given peak (1 PFLOP/s, far above this machine's, so the share is below 1):
  // the model's FLOPs of a token, 6 N + 12 L H T, N the tied Llama's 100928 parameters.
  EXPECT_EQ(m["peak_flops"].get<double>(), 1e15);
  EXPECT_EQ(m["model_flops_per_token"].get<double>(), 6.0 * 100928 + 12.0 * 2 * 64 * 32);
  EXPECT_GT(m["mfu"].get<double>(), 0);
  EXPECT_LE(m["mfu"].get<double>(), 1);
  EXPECT_DOUBLE_EQ(m["mfu"].get<double>(), m["tokens_per_second"].get<double>() * 654720.0 / 1e15);
  EXPECT_EQ(steps_of(dir_ / "steps.csv").size(), 12u);
  EXPECT_LT(m["eval"]["perplexity"].get<double>(), m["eval"]["perplexity_before"].get<double>());
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));  // --tokenizer FILE, copied in
  const auto config = nlohmann::json::parse(std::ifstream(out + "/config.json"));
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["num_hidden_layers"], 2);
}

class TrainParallel : public Train {};

// A small GPT-2 config.json (learned positions), with its default dropouts (0.1) or none.
nlohmann::json tiny_gpt2(bool dropout) {
  nlohmann::json c = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"vocab_size", 420},
                      {"n_embd", 64},
                      {"n_layer", 2},
                      {"n_head", 4},
                      {"n_positions", 64},
                      {"eos_token_id", 0}};
  if (!dropout) c["embd_pdrop"] = c["attn_pdrop"] = c["resid_pdrop"] = 0.0;
  return c;
}

// Ranks as processes through te-run.
TEST_F(TrainParallel, Dp2xTp2IsOneProcessAndResumesBitForBit) {
  const std::string mesh = "--nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tp=model";
  ASSERT_EQ(te_train(args("--log-steps " + (dir_ / "one.csv").string())).status, 0);
  expect_resume_bit_for_bit(mesh);
  const std::vector<std::string> one = steps_of(dir_ / "one.csv");
  const std::vector<std::string> sharded = steps_of(dir_ / "whole.csv");
  ASSERT_EQ(one.size(), sharded.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(loss_of(sharded[i]), loss_of(one[i]), 1e-6 * loss_of(one[i])) << "step " << i + 1;
  }
}

// A mixture of experts (Qwen3-MoE: 4 experts, 2 per token) trained expert parallel with the
// routers' load-balancing loss (--router-aux-loss): EP2 (each rank half the experts, its tokens
// sent to them by all-to-all) and EP2xTP2 give one process's losses, and EP2 resumes bit for bit
// (each rank's checkpoint its experts).
TEST_F(TrainParallel, AMixtureOfExpertsOnEp2AndEp2xTp2IsOneProcess) {
  nlohmann::json moe = {{"architectures", {"Qwen3MoeForCausalLM"}},
                        {"model_type", "qwen3_moe"},
                        {"vocab_size", 420},
                        {"hidden_size", 64},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"intermediate_size", 128},
                        {"moe_intermediate_size", 32},
                        {"num_experts", 4},
                        {"num_experts_per_tok", 2},
                        {"norm_topk_prob", true},
                        {"max_position_embeddings", 256},
                        {"tie_word_embeddings", true},
                        {"eos_token_id", 0}};
  std::ofstream(dir_ / "moe.json") << moe.dump();
  const Result single =
      te_train(args(logged("--router-aux-loss 0.05", "one.csv"), "corpus.txt", "moe.json"));
  ASSERT_EQ(single.status, 0) << single.err;
  const Result ep_tp = te_train(args(logged("--nproc 4 --mesh data=2,model=2 --mesh-resource "
                                            "dp=data,ep=data,tp=model --router-aux-loss 0.05",
                                            "ep_tp.csv"),
                                     "corpus.txt", "moe.json"));
  ASSERT_EQ(ep_tp.status, 0) << ep_tp.err;
  const std::string ep =
      "--nproc 2 --mesh data=2 --mesh-resource dp=data,ep=data --router-aux-loss 0.05";
  const std::string ck = (dir_ / "ck").string();
  ASSERT_EQ(te_train(args(logged(ep, "ep.csv"), "corpus.txt", "moe.json")).status, 0);
  ASSERT_EQ(te_train(args(ep + " --max-steps 5 --save " + ck, "corpus.txt", "moe.json")).status, 0);
  const Result rest =
      te_train(args(logged(ep + " --resume --save " + ck, "rest.csv"), "corpus.txt", "moe.json"));
  ASSERT_EQ(rest.status, 0) << rest.err;
  const std::vector<std::string> one = steps_of(dir_ / "one.csv");
  ASSERT_EQ(one.size(), 12u);
  for (const char* csv : {"ep.csv", "ep_tp.csv"}) {
    const std::vector<std::string> got = steps_of(dir_ / csv);
    ASSERT_EQ(got.size(), one.size()) << csv;
    for (std::size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(loss_of(got[i]), loss_of(one[i]), 1e-6 * loss_of(one[i]))
          << csv << " step " << i + 1;
    }
  }
  const std::vector<std::string> whole = steps_of(dir_ / "ep.csv");
  const std::vector<std::string> resumed = steps_of(dir_ / "rest.csv");
  ASSERT_EQ(resumed.size(), 7u);
  for (std::size_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed[i], whole[i + 5]);
  EXPECT_LT(loss_of(one.back()), loss_of(one.front()));
  // The router's loss is part of the loss: without it every step's is lower.
  ASSERT_EQ(te_train(args(logged("", "plain.csv"), "corpus.txt", "moe.json")).status, 0);
  EXPECT_LT(loss_of(steps_of(dir_ / "plain.csv").front()), loss_of(one.front()));
  // Bad weights, and a model without experts, are named.
  const Result negative = te_train(args("--router-aux-loss -1", "corpus.txt", "moe.json"));
  EXPECT_NE(negative.status, 0);
  EXPECT_NE(negative.err.find("--router-aux-loss -1"), std::string::npos) << negative.err;
  const Result dense = te_train(args("--router-aux-loss 0.1"));
  EXPECT_NE(dense.status, 0);
  EXPECT_NE(dense.err.find("--router-aux-loss: the model has no mixture-of-experts layer"),
            std::string::npos)
      << dense.err;
}

// ZeRO-1 (AdamW's state split over the data axis): DP2's losses, and a resume bit for bit
// through checkpoints that hold the state whole.
TEST_F(TrainParallel, Dp2WithZeroIsOneProcessAndResumesBitForBit) {
  ASSERT_EQ(te_train(args("--log-steps " + (dir_ / "one.csv").string())).status, 0);
  expect_resume_bit_for_bit("--nproc 2 --mesh data=2 --mesh-resource dp=data --zero-axis data");
  const std::vector<std::string> one = steps_of(dir_ / "one.csv");
  const std::vector<std::string> zero = steps_of(dir_ / "whole.csv");
  ASSERT_EQ(one.size(), zero.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(loss_of(zero[i]), loss_of(one[i]), 1e-6 * loss_of(one[i])) << "step " << i + 1;
  }
}

// Packed rows split over FSDP ranks (each rank its own rows, parameters gathered) train as one
// process does.
TEST_F(TrainParallel, PackedOnFsdp2IsOneProcess) {
  ASSERT_EQ(te_train(args("--pack --log-steps " + (dir_ / "one.csv").string())).status, 0);
  const Result r =
      te_train(args("--pack --nproc 2 --mesh data=2 --mesh-resource fsdp=data "
                    "--log-steps " +
                    (dir_ / "fsdp.csv").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::vector<std::string> one = steps_of(dir_ / "one.csv");
  const std::vector<std::string> fsdp = steps_of(dir_ / "fsdp.csv");
  ASSERT_EQ(one.size(), fsdp.size());
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(loss_of(fsdp[i]), loss_of(one[i]), 1e-6 * loss_of(one[i])) << "step " << i + 1;
  }
}

// Context parallelism: each row's tokens split over a cp axis (TE's table from MeshResource cp,
// or the user's rules) in every layer's attention, beside data parallelism, in TE's
// load-balanced order (ids, labels and GPT-2's learned positions alike); the losses are one
// process's, for Llama (RoPE; also a2a+p2p over two axes) and GPT-2 (learned positions), and
// for GPT-2 with its dropouts (contiguous chunks then: the banner says so).
TEST_F(TrainParallel, ContextParallelIsOneProcess) {
  std::ofstream(dir_ / "gpt2.json") << tiny_gpt2(/*dropout=*/false).dump();
  std::ofstream(dir_ / "gpt2_dropout.json") << tiny_gpt2(/*dropout=*/true).dump();
  for (const std::string config : {"config.json", "gpt2.json", "gpt2_dropout.json"}) {
    const Result base =
        te_train(args("--log-steps " + (dir_ / "one.csv").string(), "corpus.txt", config));
    ASSERT_EQ(base.status, 0) << config << ": " << base.err;
    const std::vector<std::string> one = steps_of(dir_ / "one.csv");
    for (const std::string layout :
         {"--cp-comm-type p2p --nproc 2 --mesh cp=2 --mesh-resource cp=cp",
          "--cp-comm-type all_gather --nproc 4 --mesh data=2,cp=2 --rules "
          "batch=data,seqlen_cp=cp",
          "--cp-comm-type a2a+p2p --nproc 4 --mesh ring=2,a2a=2 --rules "
          "'seqlen_cp=(ring,a2a)'"}) {
      if (config != "config.json" && layout.find("--cp-comm-type p2p") == std::string::npos) {
        continue;
      }
      // (with the banner: args' --quiet dropped)
      std::string run =
          args(layout + " --log-steps " + (dir_ / "cp.csv").string(), "corpus.txt", config);
      run.erase(run.find(" --quiet"), 8);
      const Result r = te_train(run);
      ASSERT_EQ(r.status, 0) << config << ", " << layout << ": " << r.err;
      EXPECT_NE(r.out.find(config == "gpt2_dropout.json" ? "context parallel, contiguous chunks"
                                                         : "context parallel, load-balanced order"),
                std::string::npos)
          << config << ": " << r.out;
      const std::vector<std::string> cp = steps_of(dir_ / "cp.csv");
      ASSERT_EQ(one.size(), cp.size()) << layout;
      for (std::size_t i = 0; i < one.size(); ++i) {
        EXPECT_NEAR(loss_of(cp[i]), loss_of(one[i]), 1e-6 * loss_of(one[i]))
            << config << ", " << layout << ", step " << i + 1;
      }
    }
  }
}

// Packed documents under context parallelism: each row's documents in slots of --pack-align
// (default 2*cp), in TE's thd layout over the cp ranks; the losses are those of one process
// packing with the same alignment, for p2p and a2a+p2p.
TEST_F(TrainParallel, PackedUnderContextParallelismIsOneProcess) {
  const Result base =
      te_train(args("--pack --pack-align 8 --log-steps " + (dir_ / "one.csv").string()));
  ASSERT_EQ(base.status, 0) << base.err;
  const std::vector<std::string> one = steps_of(dir_ / "one.csv");
  for (const std::string layout :
       {"--cp-comm-type p2p --nproc 2 --mesh cp=2 --mesh-resource cp=cp --pack-align 8",
        "--cp-comm-type a2a+p2p --nproc 4 --mesh ring=2,a2a=2 --rules "
        "'seqlen_cp=(ring,a2a)'"}) {
    std::string run = args("--pack " + layout + " --log-steps " + (dir_ / "cp.csv").string());
    run.erase(run.find(" --quiet"), 8);
    const Result r = te_train(run);
    ASSERT_EQ(r.status, 0) << layout << ": " << r.err;
    EXPECT_NE(r.out.find("each row's documents in TE's thd layout, slots of 8 tokens"),
              std::string::npos)
        << r.out;
    const std::vector<std::string> cp = steps_of(dir_ / "cp.csv");
    ASSERT_EQ(one.size(), cp.size()) << layout;
    for (std::size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(loss_of(cp[i]), loss_of(one[i]), 1e-6 * loss_of(one[i]))
          << layout << ", step " << i + 1;
    }
  }
  // GPT-2's embedding and residual dropouts draw at the tokens' places: refused by name.
  std::ofstream(dir_ / "gpt2_dropout.json") << tiny_gpt2(/*dropout=*/true).dump();
  const Result bad =
      te_train(args("--pack --cp-comm-type p2p --nproc 2 --mesh cp=2 "
                    "--mesh-resource cp=cp",
                    "corpus.txt", "gpt2_dropout.json"));
  EXPECT_EQ(bad.status, 2) << bad.err;
  // (te-run prints each rank's error on its output, the launcher's on its error stream)
  EXPECT_NE(bad.out.find("[rank 0] te-train: --pack with --cp-comm-type: the model has dropout "
                         "outside attention"),
            std::string::npos)
      << bad.out;
}

// A step's measured peak (tensor bytes on the fullest rank) within 10% of the plan te-train
// makes for the same run on meta tensors (te::train::plan_lm_step), on one process in fp32 and
// bf16 with fp32 masters, and on DP2xTP2 with ZeRO-1; --plan prints the plan's parts.
TEST_F(TrainParallel, PeakMemoryIsWithinTenPercentOfThePlan) {
  const std::string dp2xtp2 =
      "--nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tp=model --zero-axis data";
  for (const std::string extra : {"", "--dtype bf16", dp2xtp2.c_str()}) {
    const fs::path m = dir_ / "m.json";
    const Result r = te_train(args(extra + " --steps 3 --warmup 1 --metrics-json " + m.string()));
    ASSERT_EQ(r.status, 0) << extra << ": " << r.err;
    const auto j = nlohmann::json::parse(std::ifstream(m));
    const double peak = j["peak_bytes"].get<double>(), planned = j["planned_peak_bytes"];
    EXPECT_GT(peak, 0) << extra;
    EXPECT_NEAR(planned, peak, 0.10 * peak)
        << extra << ": planned " << planned << " measured " << peak;
  }
  // te-explain --plan of the same run (te-train splits the vocabulary over tp: --rules).
  const Result explained = te::test::run_program(
      TE_EXPLAIN_PATH, "--plan --json --config " + (dir_ / "config.json").string() +
                           " --batch 4 --seqlen 32 --micro-batches 2 --dtype fp32 --mesh "
                           "data=2,model=2 --mesh-resource dp=data,tp=model --rules vocab=model "
                           "--extend --zero-axis data");
  ASSERT_EQ(explained.status, 0) << explained.err;
  EXPECT_EQ(nlohmann::json::parse(explained.out)["memory"]["peak_bytes"],
            nlohmann::json::parse(std::ifstream(dir_ / "m.json"))["planned_peak_bytes"]);
  const Result plan = te_train(args(dp2xtp2 + " --plan"));
  ASSERT_EQ(plan.status, 0) << plan.err;
  for (const char* part : {"te-train --plan", "optimizer state", "optimizer step peak",
                           "step peak (all of the above)", "all_gather", "'data'", "'model'"}) {
    EXPECT_NE(plan.out.find(part), std::string::npos) << part << " in\n" << plan.out;
  }
}

// Rank 0 tokenizes while the others wait: a file that takes longer than the collective timeout
// (3 s here; about 4 s of tokenizing 26 MB) still trains, and bad data there stops every rank with
// its reason.
TEST_F(TrainParallel, TokenizingOnRank0OutlastsTheCollectiveTimeout) {
  std::ifstream readme(std::string(TE_SOURCE_DIR) + "/README.md");
  std::stringstream text;
  text << readme.rdbuf();
  {
    std::ofstream big(dir_ / "big.txt");
    while (big.tellp() < (26 << 20)) big << text.str();
  }
  std::ofstream(dir_ / "latin1.txt") << "ok\n\xff\xfe bad\n";
  const std::string dp2 = "--nproc 2 --mesh data=2 --mesh-resource dp=data --steps 2 --warmup 1";
  const auto run = [&](const std::string& data) {
    return te::test::run_program(std::string("env TE_DIST_TIMEOUT_S=3 ") + TE_TRAIN_PATH,
                                 args(dp2, data));
  };
  const Result ok = run("big.txt");
  EXPECT_EQ(ok.status, 0) << ok.err;
  const Result bad = run("latin1.txt");
  EXPECT_EQ(bad.status, 2) << bad.err;
  // te-run relays each rank's lines, prefixed, to its stdout.
  EXPECT_NE(bad.out.find("latin1.txt:2: not UTF-8"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("[rank 1] te-train: rank 0 could not read the data"), std::string::npos)
      << bad.out;
}

// Bad input: exit 2, one line naming the culprit, a good checkpoint left as it was.
TEST_F(Train, BadInputIsNamedAndLeavesTheCheckpoint) {
  const std::string ck = (dir_ / "ck").string();
  ASSERT_EQ(te_train(args("--max-steps 2 --save " + ck)).status, 0);
  const auto saved = fs::last_write_time(ck + "/model.safetensors");
  std::ofstream(dir_ / "empty.txt").close();
  std::ofstream(dir_ / "short.txt") << "short\n";
  std::ofstream(dir_ / "latin1.txt") << "ok\n\xff\xfe bad\n";
  std::ofstream(dir_ / "role.jsonl") << R"({"messages": [{"role": "robot", "content": "x"}]})"
                                     << "\n";
  std::ofstream(dir_ / "nochat.jsonl") << R"({"text": "x"})"
                                       << "\n";
  nlohmann::json other = nlohmann::json::parse(std::ifstream(dir_ / "config.json"));
  other["num_hidden_layers"] = 1;
  std::ofstream(dir_ / "other.json") << other.dump();
  const std::string d = dir_.path().string();
  struct Case {
    std::string extra, data, config, message;
  };
  const std::vector<Case> cases = {
      {"", "missing.txt", "config.json", "--data: no such file"},
      {"", "empty.txt", "config.json", "empty.txt: empty"},
      {"", "short.txt", "config.json", "shorter than one block"},
      {"", "latin1.txt", "config.json", "latin1.txt:2: not UTF-8"},
      {"", "role.jsonl", "config.json", "role.jsonl:1: role \"robot\""},
      {"--data-format chat", "nochat.jsonl", "config.json", "nochat.jsonl:1: no \"messages\" list"},
      {"--global-batch-tokens 300", "corpus.txt", "config.json",
       "--global-batch-tokens 300 is not a multiple"},
      {"--warmup 12", "corpus.txt", "config.json", "--warmup 12 is not in [0, --steps 12)"},
      {"--max-steps 13", "corpus.txt", "config.json", "--max-steps 13 is not in [0, --steps 12]"},
      {"--resume", "corpus.txt", "config.json", "--resume needs --save DIR"},
      {"--resume --save " + d + "/none", "corpus.txt", "config.json", "no checkpoint at"},
      {"--resume --save " + ck + " --dtype bf16", "corpus.txt", "config.json",
       "was saved by a run with another dtype"},
      {"--resume --save " + ck, "corpus.txt", "other.json",
       "was saved by a run with another model_config"},
      {"--lr-min 2", "corpus.txt", "config.json",
       "--warmup/--decay-ratio/--lr-min: LrSchedule: lr_min 2 is not in [0, 1]"},
      {"--clip -1", "corpus.txt", "config.json", "--clip -1.000000 is negative"},
      {"--resume --save " + ck + " --steps 20", "corpus.txt", "config.json",
       "was saved by a run with another schedule"},
      {"--resume --save " + ck + " --max-steps 2", "corpus.txt", "config.json",
       "has done 2 steps, and this run stops at 2"},
      {"--nproc 3 --mesh data=2", "corpus.txt", "config.json",
       "--mesh data=2 has 2 ranks but the world has 3"},
      {"--pack --nproc 2 --mesh data=2 --rules seqlen=data", "corpus.txt", "config.json",
       "--pack: the layout (mesh data=2, rules seqlen=data) splits each row's tokens over "
       "ranks"},
      {"--loss-scale 0", "corpus.txt", "config.json", "--loss-scale 0.000000 is not positive"},
      {"--cp-comm-type p2p --nproc 2 --mesh cp=2 --mesh-resource cp=cp --seq-len 34 "
       "--global-batch-tokens 272",
       "corpus.txt", "config.json",
       "--seq-len 34: context parallelism over 2 ranks cuts each row into 2*cp = 4 chunks"},
      {"--nproc 2 --mesh model=2 --mesh-resource tp=model --zero-axis model", "corpus.txt",
       "config.json", "--zero-axis: 'model' is not the data-parallel axis"},
      {"--zero-axis data", "corpus.txt", "config.json",
       "--zero-axis: 'data' is not an axis of the mesh (one process)"},
      {"--fp8 hybrid", "corpus.txt", "config.json", "--fp8: hybrid not in {none,delayed,"},
      {"--resume --save " + ck + " --fp8 delayed", "corpus.txt", "config.json",
       "was saved by a run with another fp8 (\"none\", this run: \"delayed\")"},
      {"--peak-tflops 0", "corpus.txt", "config.json", "--peak-tflops 0.000000 is not positive"},
      {"--cp-comm-type p2p --nproc 2 --mesh cp=2 --mesh-resource cp=cp --pack --pack-align 6 "
       "--seq-len 36 --global-batch-tokens 288",
       "corpus.txt", "config.json",
       "--pack-align 6: context parallelism over 2 ranks cuts each document's slot into 2*cp = 4 "
       "chunks; give a multiple of it"},
      {"--pack --pack-align 5", "corpus.txt", "config.json",
       "--seq-len 32: --pack's slots are 5 tokens apart (--pack-align), so a row must be a "
       "multiple of that"},
      {"--pack-align 4", "corpus.txt", "config.json",
       "--pack-align: it aligns --pack's documents; add --pack"},

      {"--cp-comm-type ring", "corpus.txt", "config.json", "--cp-comm-type: ring not in"},
      {"--cp-comm-type p2p --nproc 2 --mesh data=2 --mesh-resource dp=data", "corpus.txt",
       "config.json",
       "--cp-comm-type p2p: the layout (mesh data=2, mesh resource MeshResource(dp='data')) "
       "maps no mesh axis to seqlen_cp"},
  };
  for (const Case& c : cases) {
    const Result r = te_train(args(c.extra, c.data, c.config));
    EXPECT_EQ(r.status, 2) << c.data << " " << c.extra << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.extra << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.extra;
  }
  EXPECT_EQ(fs::last_write_time(ck + "/model.safetensors"), saved);
}

}  // namespace
