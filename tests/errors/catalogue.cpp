// The misuse catalogue (docs/errors.md): each case does one thing wrong, the message it gets is
// recorded verbatim (less the [file:line] tag), and the words that name the culprit must be in it.
//
//   te_error_catalogue --check docs/errors.md   exit 1 when the file differs from what the
//                                               library says today, or a case's words are missing
//   te_error_catalogue --write docs/errors.md   regenerate it
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <sys/resource.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../te/src/distributed/nccl_seams.h"
#include "../../te/src/distributed/network.h"
#include "../fake_env.h"
#include "../hf/bpe_json.h"
#include "te/distributed.h"
#include "te/distributed/backend.h"
#include "te/encoder/data.h"
#include "te/fp8.h"
#include "te/hf/save.h"
#include "te/nn.h"
#include "te/serve/openai.h"
#include "te/serve/service.h"
#include "te/train/data.h"
#include "te/train/lm_trainer.h"

namespace {

using namespace te;
using namespace te::nn;

struct Case {
  const char* area;
  const char* misuse;
  const char* words;  // what the message must contain: the culprit, named
  std::function<void()> run;
};

// This run's own folder for the cases that write files (two runs at once, or a folder another
// user left in /tmp, must not meet); messages show it as /tmp, so the text is the same on every
// machine and run.
const std::string& scratch() {
  static const std::string dir = [] {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "te_error_catalogue_XXXXXX").string();
    const char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) throw std::runtime_error("te_error_catalogue: cannot make " + tmpl);
    return std::string(made);
  }();
  return dir;
}

// A one-layer Llama config (random weights) for the training step's cases.
nlohmann::json tiny_causal_lm_json() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 16},
          {"hidden_size", 8},
          {"num_hidden_layers", 1},
          {"num_attention_heads", 2},
          {"num_key_value_heads", 1},
          {"intermediate_size", 16},
          {"max_position_embeddings", 16},
          {"tie_word_embeddings", false}};
}
te::hf::CausalLMConfig tiny_causal_lm_config() {
  return te::hf::parse_causal_lm_config(tiny_causal_lm_json().dump(), "tiny/config.json");
}

// The message without its " [file:line]" tag, which moves with every edit, and with this run's
// scratch folder shown as /tmp.
std::string untagged(std::string m) {
  const auto at = m.rfind(" [");
  if (at != std::string::npos && !m.empty() && m.back() == ']') m.erase(at);
  for (auto pos = m.find(scratch()); pos != std::string::npos; pos = m.find(scratch(), pos)) {
    m.replace(pos, scratch().size(), "/tmp");
  }
  return m;
}

// Runs `fn` on `n` thread ranks; rank 0's te::Error is the case's message.
std::function<void()> on_ranks(int n, std::function<void(int)> fn) {
  return [n, fn] {
    std::string message;
    run_local_ranks(n, [&](int rank) {
      try {
        fn(rank);
      } catch (const Error& e) {
        if (rank == 0) message = e.what();
      }
    });
    if (!message.empty()) throw Error(message);
  };
}

// A full disk, in this process: files stop growing at `bytes`, and write() fails with EFBIG
// instead of raising SIGXFSZ. The limit and the signal's disposition are put back after.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &before_);
    struct rlimit small = before_;
    small.rlim_cur = bytes;
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &before_);
    std::signal(SIGXFSZ, previous_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  struct rlimit before_ {};
  void (*previous_)(int) = nullptr;
};

// Dense(64, 8) whose kernel is held in Q8_0 blocks (all codes 1, scale 1), as te::hf holds a
// GGUF file's on one process.
Dense dense_in_blocks() {
  static const std::vector<unsigned char> bytes = [] {
    std::vector<unsigned char> b(8 * 2 * 34, 1);
    for (std::size_t k = 0; k < b.size(); k += 34) b[k] = 0x00, b[k + 1] = 0x3C;
    return b;
  }();
  auto m = std::make_shared<BlockMatrix>();
  m->type = 8;  // Q8_0
  m->rows = 8;
  m->cols = 64;
  for (int r = 0; r < 8; ++r) m->row_data.push_back(bytes.data() + r * 68);
  Dense dense(DenseOptions(64, 8));
  dense->hold_blocks(*dense, "kernel", {m, {}, true});
  return dense;
}

// A byte-level BPE tokenizer: a, b, the space, ab and <|endoftext|> (id 4), with `merges`.
te::hf::Tokenizer tiny_tokenizer(const std::vector<std::string>& merges) {
  return te::hf::Tokenizer::from_json(
      te::test::byte_level_bpe_json({"a", "b", "\u0120", "ab", "<|endoftext|>"}, merges,
                                    "<|endoftext|>", 4)
          .dump(),
      "tiny.json");
}

std::vector<Case> cases() {
  // In this run's scratch folder, shown as /tmp (untagged), so the messages are the same on every
  // machine.
  const std::string no_dir = "/nonexistent/te-checkpoint";
  const std::string empty_dir = scratch() + "/te-error-catalogue-empty";
  const std::string damaged_dir = scratch() + "/te-error-catalogue-damaged";
  const std::string full_dir = scratch() + "/te-error-catalogue-full";
  return {
      // ---- rules and MeshResource ----
      {"rules", "a logical axis named on two dims", "logical axis 'a' occurs more than once",
       [] {
         logical_to_mesh_axes({"a", "a"}, {});
       }},
      {"rules",
       "a logical axis named on two dims with no rules in scope (Flax imposes nothing there; te "
       "refuses it on one device too)",
       "logical axis 'a' occurs more than once",
       [] {
         resolve_logical_axes({"a", "a"});
       }},
      {"rules", "a rule with an empty logical name", "axis rule 0 (=x) has an empty logical name",
       [] {
         logical_to_mesh_axes({"a"}, {{"", {"x"}}});
       }},
      {"rules", "a tuple naming one mesh axis twice", "names mesh axis 'data' twice",
       [] { parse_axis_rules("batch=(data,data)"); }},
      {"rules", "an unbalanced tuple", "batch=(data", [] { parse_axis_rules("batch=(data"); }},
      {"rules", "a dim no rule assigns, under RulesFallback::kRaiseError",
       "'heads' matches no applicable rule",
       [] {
         AxisRulesScope scope(parse_axis_rules("batch=data"));
         resolve_logical_axes({"batch", "heads"}, RulesFallback::kRaiseError);
       }},
      {"rules", "extending TE's table with an entry that diverges from it",
       "the rules diverge from TE's on axis 'heads'",
       [] {
         MeshResource r;
         r.tp = "model";
         MeshResourceScope scope(r);
         extend_logical_axis_rules(parse_axis_rules("heads=model,heads="));
       }},
      {"rules", "extending TE's table with no MeshResource in scope",
       "needs a MeshResource in scope",
       [] { extend_logical_axis_rules(parse_axis_rules("vocab=model")); }},
      {"MeshResource", "an unknown role", "unknown role 'dq'",
       [] { parse_mesh_resource("dq=data"); }},
      {"MeshResource", "a role given twice", "role 'dp' given twice",
       [] { parse_mesh_resource("dp=data,dp=x"); }},
      {"MeshResource", "tp and tpsp both active (on axes of more than one device)",
       "tp and tpsp are both active",
       [] {
         MeshShapeScope mesh(parse_mesh_shape("model=2,m2=2"));
         te_default_axis_rules(parse_mesh_resource("tp=model,tpsp=m2"));
       }},
      {"MeshResource", "a role on a mesh axis the mesh does not have",
       "names mesh axis 'fsdp', which the mesh (data=2) does not have",
       [] {
         MeshShapeScope mesh(parse_mesh_shape("data=2"));
         te_default_axis_rules(parse_mesh_resource("dp=data,fsdp=fsdp"));
       }},
      {"MeshResource", "two roles on one mesh axis", "roles dp and fsdp both name mesh axis 'data'",
       [] {
         MeshResource r;
         r.dp = r.fsdp = "data";
         MeshResourceScope scope(r);
       }},
      // ---- meshes, worlds, placements ----
      {"mesh", "a mesh larger than the world", "the mesh ('data') has 2 ranks but the world has 1",
       [] { DeviceMesh({2}, {"data"}); }},
      {"mesh", "an axis name used twice", "axis name 'a' is used twice",
       [] {
         DeviceMesh({1, 1}, {"a", "a"});
       }},
      {"mesh", "asking a mesh for an axis it lacks", "mesh axis 'model' is not in",
       [] { DeviceMesh({1}, {"data"}).axis_index("model"); }},
      {"mesh", "ranks that build different meshes",
       "DeviceMesh #0 differs between ranks: rank(s) 0 built DeviceMesh(data=2); rank(s) 1 "
       "built DeviceMesh(model=2)",
       on_ranks(2, [](int rank) { DeviceMesh({2}, {rank == 0 ? "data" : "model"}); })},
      {"world", "init_distributed without the launcher's environment",
       "RANK and WORLD_SIZE (or OMPI_COMM_WORLD_RANK/SIZE, or srun's "
       "SLURM_PROCID/SLURM_STEP_NUM_TASKS) are not set",
       [] { init_distributed(); }},
      {"world", "a malformed SLURM host list",
       "SLURM_STEP_NODELIST: the SLURM host list 'gpu[01-04' is malformed",
       [] {
         read_launch_environment(test::env_of({{"SLURM_PROCID", "0"},
                                               {"SLURM_STEP_NUM_TASKS", "4"},
                                               {"SLURM_STEP_NODELIST", "gpu[01-04"}}));
       }},
      {"world", "GLOO_SOCKET_IFNAME naming several interfaces",
       "GLOO_SOCKET_IFNAME='eth0,eth1' names several interfaces; te-cpp binds one",
       [] {
         te::detail::choose_gloo_address("", "10.0.0.1", 29500, "MASTER_ADDR",
                                         test::env_of({{"GLOO_SOCKET_IFNAME", "eth0,eth1"}}));
       }},
      {"world", "a rank that would advertise its loopback address to another host",
       "rank 1 (host h1) would advertise its loopback address 127.0.1.1",
       [] {
         te::detail::PeerAddress a, b;
         a.address = "10.0.0.1";
         a.loopback = "boot-a/4026531840";
         a.host = "h0";
         a.chosen_by = "the route to MASTER_ADDR=10.0.0.1";
         b.address = "127.0.1.1";
         b.loopback = "boot-b/4026531840";
         b.host = "h1";
         b.chosen_by = "DistributedOptions::interface='lo'";
         TE_FAIL(te::detail::address_conflict({a, b}));
       }},
      {"world", "a malformed TE_COMM_BACKEND", "TE_COMM_BACKEND='mpi' is not auto, gloo or nccl",
       [] {
         ::setenv("TE_COMM_BACKEND", "mpi", 1);
         try {
           run_local_ranks(1, [](int) {});
         } catch (...) {
           ::unsetenv("TE_COMM_BACKEND");
           throw;
         }
         ::unsetenv("TE_COMM_BACKEND");
       }},
      {"world", "an NCCL communicator one of whose ranks cannot join",
       "rank 1 cannot: rank 1 would run NCCL on cuda:1, but this machine has 1 GPU(s)",
       [] {
         auto store = c10::make_intrusive<c10d::HashStore>();
         std::string message;
         std::thread peer([&] {
           try {
             comm::exchange_peer_status(
                 *store, 1, {0, 1},
                 {"", "rank 1 would run NCCL on cuda:1, but this machine has 1 GPU(s)"},
                 std::chrono::seconds(30));
           } catch (const Error&) {
           }
         });
         try {
           comm::exchange_peer_status(*store, 0, {0, 1}, {"0000:01:00.0", ""},
                                      std::chrono::seconds(30));
         } catch (const Error& e) {
           message = e.what();
         }
         peer.join();
         if (!message.empty()) throw Error(message);
       }},
      {"placements", "a Shard dim the tensor does not have",
       "Shard(1) on mesh axis 'x' names dim 1 of a 1-dim tensor",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"x"});
                  DTensor::from_local(at::zeros({2}), mesh, {Shard{1}});
                })},
      {"placements", "more placements than mesh dims", "2 placements [Shard(0), Replicate()] for",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"x"});
                  DTensor::from_local(at::zeros({2}), mesh, {Shard{0}, Replicate{}});
                })},
      {"placements", "distributing a whole tensor as Partial",
       "Partial(sum) on mesh axis 'x': a whole tensor cannot be split",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"x"});
                  DTensor::distribute(at::zeros({2}), mesh, {Partial{}});
                })},
      {"placements", "redistributing to a Partial the source is not",
       "redistribute to Partial(sum) on mesh dim 0 (from Shard(0)) is not possible",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"x"});
                  DTensor::distribute(at::zeros({4}), mesh, {Shard{0}}).redistribute({Partial{}});
                })},
      {"placements", "Partial placements of mixed reduce ops (but sum with avg)",
       "mix Partial reduce ops (max, avg)",
       on_ranks(4,
                [](int) {
                  DeviceMesh mesh({2, 2}, {"a", "b"});
                  DTensor::from_local(at::ones({2}), mesh,
                                      {Partial{ReduceOp::kMax}, Partial{ReduceOp::kAvg}});
                })},
      {"placements", "averaging integers", "Partial(avg) of a Long tensor would truncate",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"x"});
                  DTensor::from_local(at::ones({2}, at::kLong), mesh, {Partial{ReduceOp::kAvg}})
                      .full_tensor();
                })},
      {"constraints", "fewer logical axes than dims", "1 logical axes ('batch') for a 2-dim tensor",
       [] {
         with_sharding_constraint(at::zeros({2, 3}), {"batch"});
       }},
      {"constraints", "a rule naming a mesh axis the mesh lacks", "over mesh axis 'model', which",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"data"});
                  MeshScope scope(mesh);
                  AxisRulesScope rules(parse_axis_rules("batch=model"));
                  with_sharding_constraint(
                      DTensor::distribute(at::zeros({2, 2}), mesh, {Replicate{}}),
                      {"batch", std::nullopt});
                })},
      {"constraints", "a tensor of one mesh constrained under another",
       "but the current mesh is another",
       on_ranks(2,
                [](int) {
                  DeviceMesh a({2}, {"data"});
                  DeviceMesh b({2}, {"data"});
                  MeshScope scope(b);
                  AxisRulesScope rules(parse_axis_rules("batch=data"));
                  with_sharding_constraint(DTensor::distribute(at::zeros({2, 2}), a, {Replicate{}}),
                                           {"batch", std::nullopt});
                })},
      // ---- modules ----
      {"modules", "a Dense of zero width", "in_features (0) and out_features (3) must be positive",
       [] { Dense(DenseOptions(0, 3)); }},
      {"modules", "kernel axes of the wrong rank",
       "parameter 'kernel' has 2 dims but 1 logical axes ('w_fsdp')",
       [] { Dense(DenseOptions(4, 3).kernel_axes({"w_fsdp"})); }},
      {"modules", "an unknown layer-norm type",
       "layernorm_type 'batchnorm' is not 'layernorm' or 'rmsnorm'",
       [] { LayerNorm(LayerNormOptions(8).layernorm_type("batchnorm")); }},
      {"modules", "an unknown MLP activation", "activation 'swish' is not one of",
       [] { LayerNormMLP(LayerNormMLPOptions(8, 16).activations({"swish"})); }},
      {"modules", "a dropout rate of 1", "intermediate_dropout_rate 1 is not in [0, 1)",
       [] { LayerNormMLP(LayerNormMLPOptions(8, 16).intermediate_dropout_rate(1.0)); }},
      {"modules", "an unknown attention mask type", "attn_mask_type 'sliding' is not one of",
       [] { DotProductAttention(DotProductAttentionOptions(4, 8).attn_mask_type("sliding")); }},
      {"modules", "heads that GQA groups do not divide",
       "4 heads are not a multiple of num_gqa_groups 3",
       [] { DotProductAttention(DotProductAttentionOptions(4, 8).num_gqa_groups(3)); }},
      {"modules", "a padding mask type called without a mask", "needs a mask",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("padding"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q);
       }},
      {"modules", "a sliding window a causal mask type cannot have",
       "window_size (-1, 3) is not valid for attn_mask_type 'causal_bottom_right'",
       [] {
         DotProductAttention(DotProductAttentionOptions(4, 8)
                                 .attn_mask_type("causal_bottom_right")
                                 .window_size(WindowSize{-1, 3}));
       }},
      {"modules", "a sliding window with one unbounded side on a non-causal type",
       "window_size (2, -1) is not valid for attn_mask_type 'padding'",
       [] {
         DotProductAttention(DotProductAttentionOptions(4, 8).attn_mask_type("padding").window_size(
             WindowSize{2, -1}));
       }},
      {"modules", "an odd rotary dim", "the rotary dim 7 is not a positive even number",
       [] { RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(7)); }},
      {"modules", "rotary frequencies wider than the heads",
       "the rotary dim 16 of freqs [4, 1, 1, 16] must be even and at most the head dim 8",
       [] {
         functional::apply_rotary_pos_emb(at::zeros({1, 4, 2, 8}),
                                          RotaryPositionEmbedding(16)->forward(4), "bshd");
       }},
      {"modules", "rotary frequencies for fewer positions than the sequence",
       "positions up to 5 need freqs for 6 positions, but freqs has 4",
       [] {
         functional::apply_rotary_pos_emb(at::zeros({1, 6, 2, 8}),
                                          RotaryPositionEmbedding(8)->forward(4), "bshd");
       }},
      {"modules", "cu_seqlens that do not start at 0", "cu_seqlens starts at 2, not 0",
       [] {
         functional::apply_rotary_pos_emb(at::zeros({6, 2, 8}),
                                          RotaryPositionEmbedding(8)->forward(8), "thd", false,
                                          at::tensor({2, 6}));
       }},
      {"modules", "cu_seqlens that decrease", "cu_seqlens decreases at entry 2 (4 -> 3)",
       [] {
         functional::apply_rotary_pos_emb(at::zeros({6, 2, 8}),
                                          RotaryPositionEmbedding(8)->forward(8), "thd", false,
                                          at::tensor({0, 4, 3, 6}));
       }},
      {"modules", "cu_seqlens that do not match the token count",
       "cu_seqlens ends at 5 but there are 6 tokens",
       [] {
         functional::apply_rotary_pos_emb(at::zeros({6, 2, 8}),
                                          RotaryPositionEmbedding(8)->forward(8), "thd", false,
                                          at::tensor({0, 5}));
       }},
      {"modules", "start_positions of the wrong length",
       "start_positions has 1 entries for 2 sequences",
       [] {
         functional::apply_rotary_pos_emb(at::zeros({2, 4, 2, 8}),
                                          RotaryPositionEmbedding(8)->forward(8), "bshd", false, {},
                                          at::tensor(std::vector<int64_t>{1}));
       }},
      {"modules", "thd split on its token dim", "is sharded on its token dim over mesh axis 'sp'",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"sp"});
                  functional::apply_rotary_pos_emb(
                      DTensor::distribute(at::zeros({6, 2, 8}), mesh, {Shard{0}}),
                      RotaryPositionEmbedding(8)->forward(8), "thd", false, at::tensor({0, 6}));
                })},
      {"modules", "an interpolation factor without the pretrained length",
       "needs pretrained_max_position_embeddings",
       [] {
         RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(8).seq_len_interpolation_factor(4));
       }},
      {"modules", "LongRoPE's long factors without the pretrained length",
       "long_frequency_factors need pretrained_max_position_embeddings",
       [] {
         RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(4).long_frequency_factors({1, 2}));
       }},
      {"modules", "a rotary attention factor without the rotary frequencies",
       "rotary_attention_factor 2 without rotary_pos_emb",
       [] {
         MultiHeadAttention mha(MultiHeadAttentionOptions(16, 4));
         mha(at::zeros({1, 3, 16}), {}, {}, AttentionArgs().rotary_attention_factor(2));
       }},
      {"modules", "an attention mask that does not broadcast to the logits",
       "attention mask [2, 4, 2, 2] does not broadcast to the logits [batch 1",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("arbitrary"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, at::zeros({2, 4, 2, 2}, at::kBool));
       }},
      {"modules", "a padding mask with a head dim",
       "the padding mask of attn_mask_type 'padding' has 4 heads",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("padding"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, at::zeros({1, 4, 2, 2}, at::kBool));
       }},
      {"modules", "an attention mask that is not bool",
       "attention mask is Float: give a bool tensor",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("arbitrary"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         functional::AttentionCall call;
         call.mask = at::zeros({1, 1, 2, 2});
         call.spec = dpa->mask_spec;
         functional::attention(q, q, q, call);
       }},
      {"modules", "an unknown attention bias type",
       "core_attention_bias_type 'relative' is not one of no_bias, pre_scale_bias, "
       "post_scale_bias, alibi",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {}, AttentionArgs().core_attention_bias_type("relative"));
       }},
      {"modules", "an attention bias that does not fit the logits",
       "core_attention_bias [1, 3, 2, 2] does not fit the logits [batch 1, heads 4, seqlen_q 2, "
       "seqlen_kv 2]",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs()
                 .core_attention_bias_type("post_scale_bias")
                 .core_attention_bias(at::zeros({1, 3, 2, 2})));
       }},
      {"modules", "a bias given with a bias type that takes none",
       "core_attention_bias_type 'no_bias' takes no core_attention_bias",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {}, AttentionArgs().core_attention_bias(at::zeros({1, 4, 2, 2})));
       }},
      {"modules", "ALiBi slopes of the wrong shape",
       "alibi_slopes [3] are not [heads 4] or [batch 1, heads 4]",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs().core_attention_bias_type("alibi").alibi_slopes(at::ones({3})));
       }},
      {"modules", "packed sequences (qkv_format thd) without a padding mask type",
       "qkv_format 'thd' needs a padding attn_mask_type",
       [] {
         DotProductAttention(
             DotProductAttentionOptions(4, 8).attn_mask_type("causal").qkv_format("thd"));
       }},
      {"modules", "cu_seqlens_q that runs past the packed tokens",
       "cu_seqlens_q ends at 7 but there are only 6 tokens",
       [] {
         DotProductAttention dpa(
             DotProductAttentionOptions(4, 8).attn_mask_type("padding").qkv_format("thd"));
         const at::Tensor q = at::zeros({6, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs().cu_seqlens_q(at::tensor({0, 7})).cu_seqlens_kv(at::tensor({0, 6})));
       }},
      {"modules", "rows of packed sequences with one row's cu_seqlens",
       "rows of packed sequences [rows, tokens, heads, head_dim] take 2-D cu_seqlens",
       [] {
         DotProductAttention dpa(
             DotProductAttentionOptions(4, 8).attn_mask_type("padding").qkv_format("thd"));
         const at::Tensor q = at::zeros({2, 6, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs().cu_seqlens_q(at::tensor({0, 6})).cu_seqlens_kv(at::tensor({0, 6})));
       }},
      {"modules", "a row of packed sequences that runs past its tokens",
       "cu_seqlens_q row 1 ends at 7 but there are only 6 tokens",
       [] {
         DotProductAttention dpa(
             DotProductAttentionOptions(4, 8).attn_mask_type("padding").qkv_format("thd"));
         const at::Tensor q = at::zeros({2, 6, 4, 8});
         const at::Tensor cu = at::tensor({0, 6, 0, 7}).view({2, 2});
         dpa(q, q, q, {}, AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu));
       }},
      {"modules", "context parallelism with an unknown cp_comm_type",
       "cp_comm_type 'ring' is not one of p2p, all_gather, a2a",
       [] { DotProductAttentionOptions(4, 8).cp_comm_type("ring"); }},
      {"modules", "a sliding window with cp_comm_type p2p",
       "a sliding window (3, 0) is not taken by cp_comm_type 'p2p'",
       on_ranks(2,
                [](int) {
                  const functional::ContextParallel cp(DeviceMesh({2}, {"cp"}), "cp", "p2p");
                  functional::AttentionCall call;
                  call.spec = functional::mask_spec("causal", WindowSize{3, 0});
                  const at::Tensor q = at::zeros({1, 4, 2, 8});
                  functional::context_parallel_attention(q, q, q, call, cp);
                })},
      {"modules", "a sequence that does not split into 2 x cp chunks (load balanced)",
       "each rank holds 3 tokens, an odd number",
       on_ranks(2,
                [](int) {
                  const functional::ContextParallel cp(DeviceMesh({2}, {"cp"}), "cp", "p2p");
                  functional::AttentionCall call;
                  call.spec = functional::mask_spec("causal");
                  const at::Tensor q = at::zeros({1, 3, 2, 8});
                  functional::context_parallel_attention(q, q, q, call, cp);
                })},
      {"modules", "heads not divisible by cp for cp_comm_type a2a",
       "3 query heads and 3 key/value heads must each divide by cp = 2",
       on_ranks(2,
                [](int) {
                  const functional::ContextParallel cp(DeviceMesh({2}, {"cp"}), "cp", "a2a");
                  functional::AttentionCall call;
                  const at::Tensor q = at::zeros({1, 4, 3, 8});
                  functional::context_parallel_attention(q, q, q, call, cp);
                })},
      {"modules", "an arbitrary mask under context parallelism",
       "attn_mask_type 'arbitrary' is not taken with context parallelism",
       on_ranks(2,
                [](int) {
                  const functional::ContextParallel cp(DeviceMesh({2}, {"cp"}), "cp", "all_gather");
                  functional::AttentionCall call;
                  call.spec = functional::mask_spec("arbitrary");
                  call.mask = at::zeros({1, 2, 8, 8}, at::kBool);
                  const at::Tensor q = at::zeros({1, 4, 2, 8});
                  functional::context_parallel_attention(q, q, q, call, cp);
                })},
      {"modules", "packed sequences (thd) under context parallelism in slots TE refuses",
       "sequence 0 has a slot of 6 tokens (cu_seqlens_padded[0..1]); pad each sequence to a "
       "multiple of 4",
       on_ranks(2,
                [](int) {
                  const functional::ContextParallel cp(DeviceMesh({2}, {"cp"}), "cp", "p2p");
                  functional::AttentionCall call;
                  call.spec = functional::mask_spec("padding_causal");
                  call.packed.cu_seqlens_q = call.packed.cu_seqlens_kv = at::tensor({0, 5, 8});
                  call.packed.cu_seqlens_q_padded = call.packed.cu_seqlens_kv_padded =
                      at::tensor({0, 6, 8});
                  const at::Tensor q = at::zeros({4, 2, 8});
                  functional::context_parallel_attention(q, q, q, call, cp);
                })},
      {"modules", "cp_comm_type set while the rules map no mesh axis to seqlen_cp",
       "map the logical axis 'seqlen_cp' to a mesh axis in the rules (or MeshResource cp)",
       on_ranks(2,
                [](int) {
                  DeviceMesh mesh({2}, {"data"});
                  MeshScope scope(mesh);
                  AxisRulesScope rules(parse_axis_rules("batch=data"));
                  auto o = MultiHeadAttentionOptions(32, 4);
                  o.attention().cp_comm_type("p2p");
                  MultiHeadAttention mha(o);
                  mha(DTensor::distribute(at::zeros({2, 8, 32}), mesh, {Replicate{}}));
                })},
      {"modules", "a bias tensor with packed sequences",
       "core_attention_bias_type 'post_scale_bias' is not supported with qkv_format 'thd'",
       [] {
         DotProductAttention dpa(
             DotProductAttentionOptions(4, 8).attn_mask_type("padding").qkv_format("thd"));
         const at::Tensor q = at::zeros({6, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs()
                 .cu_seqlens_q(at::tensor({0, 6}))
                 .cu_seqlens_kv(at::tensor({0, 6}))
                 .core_attention_bias_type("post_scale_bias")
                 .core_attention_bias(at::zeros({1, 4, 6, 6})));
       }},
      {"modules", "cu_seqlens given to whole (bshd) sequences",
       "cu_seqlens are for qkv_format 'thd'",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs().cu_seqlens_q(at::tensor({0, 2})).cu_seqlens_kv(at::tensor({0, 2})));
       }},
      {"modules", "q, k or v whose head dim is not the module's (kv_channels)",
       "do not have head_dim 8 (q, k) and 6 (v) in their last dim",
       [] {
         DotProductAttention dpa(
             DotProductAttentionOptions(4, 8).head_dim_v(6).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q);
       }},
      {"modules", "an unknown softmax type",
       "softmax_type 'sink' is not one of vanilla, off-by-one, learnable",
       [] { DotProductAttention(DotProductAttentionOptions(4, 8).softmax_type("sink")); }},
      {"modules", "rotary frequencies given to DotProductAttention",
       "DotProductAttention takes no rotary_pos_emb",
       [] {
         DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {}, AttentionArgs().rotary_pos_emb(at::zeros({2, 1, 1, 8})));
       }},
      {"modules", "parallel attention and MLP with a post-LN structure",
       "parallel_attention_mlp cannot be combined with apply_residual_connection_post_layernorm "
       "or output_layernorm",
       [] {
         TransformerLayer(
             TransformerLayerOptions(16, 24, 4).parallel_attention_mlp(true).output_layernorm(
                 true));
       }},
      {"modules", "a soft cap beside an attention bias",
       "softcap takes no core_attention_bias_type beside it",
       [] {
         DotProductAttention dpa(
             DotProductAttentionOptions(4, 8).attn_mask_type("no_mask").softcap(30));
         const at::Tensor q = at::zeros({1, 2, 4, 8});
         dpa(q, q, q, {},
             AttentionArgs()
                 .core_attention_bias_type("post_scale_bias")
                 .core_attention_bias(at::zeros({1, 4, 2, 2})));
       }},
      {"modules", "norms after the blocks of a decoder layer",
       "post_block_layernorm needs layer_type 'encoder'",
       [] {
         TransformerLayer(
             TransformerLayerOptions(16, 24, 4).layer_type("decoder").post_block_layernorm(true));
       }},
      {"modules", "an unknown qk-norm type",
       "qk_norm_type 'BatchNorm' is not one of RMSNorm, LayerNorm, L2Normalization",
       [] { MultiHeadAttention(MultiHeadAttentionOptions(16, 4).qk_norm_type("BatchNorm")); }},
      {"modules", "a gated TE-PyTorch activation inside a slot list",
       "'swiglu' is a whole TE-PyTorch activation (2 slots); give it alone",
       [] {
         LayerNormMLP(LayerNormMLPOptions(8, 12).activations({"swiglu", "linear"}));
       }},
      {"modules", "a drop path rate outside [0, 1)", "drop_path_rate 1 is not in [0, 1)",
       [] { TransformerLayer(TransformerLayerOptions(16, 24, 4).drop_path_rate(1.0)); }},
      {"mixture of experts", "a router asked for more experts than there are",
       "topk 9 is not in [1, 8]",
       [] {
         functional::RouterOptions o;
         o.topk = 9;
         functional::topk_with_score_function(at::zeros({4, 8}), o);
       }},
      {"mixture of experts", "an expert bias with the softmax score function",
       "expert_bias is used with score_function sigmoid or sqrtsoftplus",
       [] {
         functional::topk_with_score_function(at::zeros({4, 8}), {}, at::zeros({8}));
       }},
      {"mixture of experts", "experts' outputs that are not the permutation's rows",
       "give [8, hidden]",
       [] {
         const at::Tensor x = at::zeros({4, 3});
         const auto p = functional::moe_permute(x, at::ones({4, 2}, at::kBool));
         functional::moe_unpermute(x, p);
       }},
      {"mixture of experts", "a shared expert gate without a shared expert",
       "shared_expert_gate needs a shared expert (shared_expert_size > 0)",
       [] { LayerNormMoE moe(LayerNormMoEOptions(8, 6, 4).shared_expert_gate(true)); }},
      {"mixture of experts", "a load-balancing loss over no router load",
       "load_balancing_loss: no router load; run the model's forward inside the RouterLoadScope",
       [] { load_balancing_loss({}); }},
      {"mixture of experts", "a router loss counted without the forward's router loads",
       "output_router_logits) but no layer's router load was recorded",
       [] {
         hf::CausalLMConfig c;
         c.output_router_logits = true;
         hf::router_aux_loss(c, {});
       }},
      {"mixture of experts", "a gpt-oss checkpoint with MXFP4 experts (OpenAI's published files)",
       "quantization_config: te-cpp reads gpt-oss's experts in floating point, not MXFP4",
       [] {
         nlohmann::json j = {{"model_type", "gpt_oss"},
                             {"vocab_size", 64},
                             {"hidden_size", 16},
                             {"intermediate_size", 8},
                             {"num_hidden_layers", 2},
                             {"num_attention_heads", 4},
                             {"num_local_experts", 4},
                             {"num_experts_per_tok", 2},
                             {"quantization_config", {{"quant_method", "mxfp4"}}}};
         hf::parse_causal_lm_config(j.dump(), "gpt-oss-20b/config.json");
       }},
      {"distributed", "more ranks on a host than it has GPUs",
       "has LOCAL_RANK 2, but this host has 2 GPU(s)", [] { device_for_local_rank(2, 2); }},
      // ---- FP8 ----
      {"FP8", "an unknown amax algorithm", "amax_compute_algo 'mean' is not 'max' or 'most_recent'",
       [] {
         fp8::DelayedScaling d;
         d.amax_compute_algo = "mean";
         Fp8Autocast autocast(true, d);
       }},
      {"FP8", "quantizing integers", "cannot cast a Long tensor to FP8",
       [] { fp8::quantize(at::ones({3}, at::kLong), at::ones({1}), fp8::DType::kE4M3); }},
      {"FP8", "a scale that is not one fp32 element", "scale must be an fp32 tensor of one element",
       [] { fp8::quantize(at::ones({3}), at::ones({2}), fp8::DType::kE4M3); }},
      {"FP8", "a scale_inv that is not on its codes' device",
       "scale_inv is on meta but the data on cpu",
       [] {
         fp8::Fp8Tensor t = fp8::quantize(at::ones({4, 16}), at::ones({1}), fp8::DType::kE4M3);
         t.scale_inv = at::empty({1}, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
         t.dequantize();
       }},
      {"FP8", "FP8 weights in training with a block recipe", "grad=1x128) scales blocks",
       [] {
         Dense dense(DenseOptions(16, 8));
         quantize_fp8_weights(*dense, fp8::Float8BlockScaling{});
       }},
      {"FP8", "a held FP8 kernel stepped without requantizing",
       "the kernel 'kernel' changed since its FP8 codes were cast",
       [] {
         Dense dense(DenseOptions(16, 8));
         quantize_fp8_weights(*dense, fp8::CurrentScaling{});
         {
           at::NoGradGuard no_grad;
           dense->kernel.mul_(0.5);  // what an optimizer step does
         }
         Fp8Autocast fp8(true, fp8::CurrentScaling{});
         dense(at::ones({2, 16}));
       }},
      // ---- GGUF blocks ----
      {"GGUF blocks", "training a kernel held in GGUF blocks",
       "is held in GGUF Q8_0 blocks (inference only) but its input requires grad",
       [] {
         dense_in_blocks()(at::ones({2, 64}).requires_grad_(true));
       }},
      {"GGUF blocks", "saving a model that holds GGUF blocks",
       "'kernel' is held in GGUF blocks, which a checkpoint does not store",
       [no_dir] { save_checkpoint(*dense_in_blocks(), no_dir); }},
      {"GGUF blocks", "FP8 weights from GGUF blocks",
       "is held in GGUF Q8_0 blocks; load the model with te::hf::LoadOptions::dequantize_gguf",
       [] { freeze_fp8_weights(*dense_in_blocks()); }},
      {"GGUF blocks", "blocks of another shape than the parameter",
       "but the blocks hold a [8, 64] matrix (the parameter transposed)",
       [] {
         Dense other(DenseOptions(32, 8));
         other->hold_blocks(*other, "kernel", dense_in_blocks()->all_held_blocks().at("kernel"));
       }},
      // ---- checkpoints ----
      {"checkpoints", "loading from a directory with no checkpoint", "no checkpoint at",
       [no_dir] {
         Dense dense(DenseOptions(4, 3));
         load_checkpoint(*dense, no_dir);
       }},
      {"checkpoints", "an index whose piece lies outside its tensor",
       "is damaged at te.tensors.'kernel'.pieces[0]: it reaches element 5 of dim 0, which has 4",
       [damaged_dir] {
         Dense dense(DenseOptions(4, 3));
         save_checkpoint(*dense, damaged_dir);
         const std::string path = damaged_dir + "/model.safetensors.index.json";
         nlohmann::json index = nlohmann::json::parse(std::ifstream(path));
         index["te"]["tensors"]["kernel"]["pieces"][0]["offsets"][0] = 1;
         std::ofstream(path) << index.dump(1);
         load_checkpoint(*dense, damaged_dir);
       }},
      {"checkpoints", "a save onto a full disk (here: a 4 KiB file-size limit)",
       "writing '/tmp/te-error-catalogue-full.saving/model.safetensors' failed: File too large",
       [full_dir] {
         FileSizeLimit limit(4096);
         Dense dense(DenseOptions(64, 64));
         save_checkpoint(*dense, full_dir);
       }},
      // ---- te-encoder, te-serve ----
      {"te-encoder", "a data directory without CoLA files", "holds neither in_domain_train.tsv",
       [empty_dir] {
         std::filesystem::create_directories(empty_dir);
         encoder::cola_files(empty_dir);
       }},
      {"te-serve", "a request without \"sentences\"", "\"sentences\"",
       [] { te::serve::decode_classify(R"({"text": "hi"})", 8); }},
      {"te-serve", "a request body that is not UTF-8", "UTF-8",
       [] { te::serve::decode_classify("{\"sentences\": [\"\xff\"]}", 8); }},
      {"te-serve", "a completion request asking for two choices", "\"n\" is 2",
       [] { te::serve::decode_completion(R"({"prompt": "hi", "n": 2})", false); }},
      {"te-serve", "a chat message with a role te-serve does not know", "messages[0].role",
       [] {
         te::serve::decode_completion(R"({"messages": [{"role": "tool", "content": "x"}]})", true);
       }},
      // ---- te-train's data (te::train) ----
      {"te-train data", "a data file that does not exist", "missing.txt: cannot open",
       [] { te::train::read_source(scratch() + "/missing.txt"); }},
      {"te-train data", "an empty data file", "data.txt: empty",
       [] { te::train::parse_source("data.txt", ""); }},
      {"te-train data", "a data file that is not UTF-8", "data.txt:2: not UTF-8 (byte offset 9)",
       [] { te::train::parse_source("data.txt", "fine\nbad \xff\n"); }},
      {"te-train data", "a JSON line that is not JSON", "data.jsonl:2: not JSON",
       [] { te::train::parse_source("data.jsonl", "{\"text\": \"a\"}\n{text: b}\n"); }},
      {"te-train data", "a JSON line without the text field", "data.jsonl:1: no string field",
       [] { te::train::parse_source("data.jsonl", "{\"body\": \"a\"}\n"); }},
      {"te-train data", "a chat line without a messages list", "chat.jsonl:1: no \"messages\"",
       [] {
         te::train::parse_source("chat.jsonl", "{\"turns\": []}", {te::train::SourceKind::kChat});
       }},
      {"te-train data", "a chat message with a role te-train does not know",
       "chat.jsonl:1: role \"tool\"",
       [] {
         te::train::parse_source("chat.jsonl",
                                 R"({"messages": [{"role": "tool", "content": "x"}]})");
       }},
      {"te-train data", "a token file made by another tokenizer",
       "this token file was made with another tokenizer",
       [] {
         const std::string data = scratch() + "/data.txt";
         std::ofstream(data) << "ab ab ab\n";
         te::train::TokenFileOptions o;
         o.eos_id = 4;
         o.progress = false;
         te::train::TokenFile::open_or_build(data, tiny_tokenizer({"a b"}), o);
         te::train::TokenFile::open_or_build(data, tiny_tokenizer({}), o);
       }},
      {"te-train data", "a data file shorter than one block", "shorter than one block",
       [] {
         const std::string data = scratch() + "/short.txt";
         std::ofstream(data) << "ab ab ab\n";
         te::train::TokenFileOptions o;
         o.eos_id = 4;
         o.progress = false;
         te::train::DataOptions d;
         d.seq_len = 1024;
         te::train::DataLoader(te::train::TokenFile::open_or_build(data, tiny_tokenizer({}), o),
                               {0}, d);
       }},
      {"te-train data", "a seq_len below 1", "seq_len 0 is below 1",
       [] {
         const std::string data = scratch() + "/short.txt";
         std::ofstream(data) << "ab ab ab\n";
         te::train::TokenFileOptions o;
         o.eos_id = 4;
         o.progress = false;
         te::train::DataLoader(te::train::TokenFile::open_or_build(data, tiny_tokenizer({}), o),
                               {0}, {});
       }},
      {"te-train data", "an eval fraction outside [0, 1)", "eval fraction 1.5",
       [] { te::train::split_documents(10, 1.5, 0, 0); }},
      // ---- the training step (te::optim::AdamW, te::train::LmTrainer) and export ----
      {"training step", "AdamW with a beta outside [0, 1)", "AdamW: beta2 1 is outside [0, 1)",
       [] {
         te::optim::AdamW({at::zeros({2}, at::requires_grad())},
                          te::optim::AdamWOptions(1e-3).betas({0.9, 1.0}));
       }},
      {"training step", "a parameter given to AdamW twice", "is in parameter group 0 and again",
       [] {
         const at::Tensor p = at::zeros({2}, at::requires_grad());
         te::optim::AdamW(std::vector<at::Tensor>{p, p});
       }},
      {"training step", "a gradient of another dtype than its parameter",
       "AdamW: a Double gradient for a Float parameter [2]",
       [] {
         at::Tensor p = at::zeros({2}, at::requires_grad());
         te::optim::AdamW opt({p});
         p.mutable_grad() = at::zeros({2}, at::kDouble);
         opt.step();
       }},
      {"training step", "LmTrainer without a schedule", "TrainerOptions::schedule is not set",
       [] {
         te::hf::CausalLM model(tiny_causal_lm_config());
         te::train::LmTrainer(model, te::train::TrainerOptions{});
       }},
      {"training step", "a micro-batch whose label count is wrong",
       "micro-batch 0 says label_tokens 5 but has 2 labels other than -100",
       [] {
         te::train::TrainerOptions o;
         o.schedule = te::optim::LrScheduleOptions(1);
         te::train::LmTrainer trainer(te::hf::CausalLM(tiny_causal_lm_config()), o);
         te::train::Batch b;
         b.ids = at::zeros({1, 2}, at::kLong);
         b.labels = at::zeros({1, 2}, at::kLong);
         b.position_ids = at::arange(2).view({1, 2});
         b.label_tokens = 5;
         trainer.step({b}, 0);
       }},
      {"training step", "saving a model under another model's config",
       "says num_hidden_layers 3 but the model has 1",
       [] {
         const te::hf::CausalLM model(tiny_causal_lm_config());
         nlohmann::json j = tiny_causal_lm_json();
         j["num_hidden_layers"] = 3;
         te::hf::save_causal_lm(*model, scratch() + "/export", j.dump());
       }},
      {"training step", "a GGUF export type te-cpp does not write",
       "save_gguf: type 'q4_k' is not f32, f16, bf16 or q8_0",
       [] {
         const te::hf::CausalLM model(tiny_causal_lm_config());
         te::hf::save_gguf(*model, scratch() + "/source.gguf", scratch() + "/out.gguf", "q4_k");
       }},
  };
}

std::string catalogue(bool& words_ok) {
  std::ostringstream md;
  md << "# te-cpp misuse catalogue\n\n"
     << "What te-cpp says when it is used wrongly: each case below does one thing wrong and "
        "shows the message it gets, verbatim (less the `[file:line]` tag every library "
        "message ends with). Library errors are `te::Error`; te-encoder and te-serve turn theirs "
        "into one line on stderr (exit 2) and an HTTP status with a JSON message.\n\n"
     << "Generated by `tests/errors/catalogue.cpp`; the test `errors.catalogue` fails when this "
        "file and the library disagree. Regenerate with "
        "`build/tests/te_error_catalogue --write docs/errors.md`.\n";
  std::string area;
  int n = 0;
  words_ok = true;
  for (const Case& c : cases()) {
    std::string message = "(no error)";
    try {
      c.run();
    } catch (const std::exception& e) {
      message = untagged(e.what());
    }
    if (message.find(c.words) == std::string::npos) {
      std::cerr << "case " << n + 1 << " (" << c.misuse << "): the message does not contain \""
                << c.words << "\": " << message << "\n";
      words_ok = false;
    }
    if (c.area != area) {
      area = c.area;
      md << "\n## " << area << "\n";
    }
    std::string indented;  // every line inside the list item's code block
    std::istringstream lines(message);
    for (std::string line; std::getline(lines, line);) indented += "   " + line + "\n";
    md << "\n" << ++n << ". **" << c.misuse << "**\n\n   ```\n" << indented << "   ```\n";
  }
  md << "\n" << n << " cases.\n";
  return md.str();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc != 3 || (mode != "--check" && mode != "--write")) {
    std::cerr << "usage: te_error_catalogue --check|--write docs/errors.md\n";
    return 2;
  }
  set_warning_handler([](std::string_view) {});  // the TE-table deprecation notice
  bool words_ok = true;
  const std::string text = catalogue(words_ok);
  std::error_code ec;
  std::filesystem::remove_all(scratch(), ec);
  if (mode == "--write") {
    std::ofstream(argv[2]) << text;
    std::cout << "wrote " << argv[2] << "\n";
    return words_ok ? 0 : 1;
  }
  std::ifstream in(argv[2]);
  std::stringstream committed;
  committed << in.rdbuf();
  if (committed.str() != text) {
    std::cerr << argv[2] << " differs from what the library says now; regenerate it with "
              << "te_error_catalogue --write " << argv[2] << ". Expected:\n"
              << text;
    return 1;
  }
  std::cout << argv[2] << " matches the library\n";
  return words_ok ? 0 : 1;
}
