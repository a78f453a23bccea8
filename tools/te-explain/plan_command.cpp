#include "plan_command.h"

#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>

#include "te/fp8/recipe.h"
#include "te/hf/config.h"
#include "te/nn/attention_types.h"
#include "te/nn/plan.h"
#include "te/train/lm_trainer.h"

namespace {

// Shapes of published models (their config.json): what --model names.
struct Preset {
  const char* name;
  int64_t layers, hidden, ffn, heads, kv_heads;
  const char* activation;
  const char* norm;
  const char* what;
};
constexpr Preset kPresets[] = {
    {"te-encoder", 1, 256, 1024, 8, 0, "gelu", "layernorm",
     "te-encoder's TransformerLayer (examples/encoder)"},
    {"llama-7b", 32, 4096, 11008, 32, 0, "swiglu", "rmsnorm", "Llama 2 7B's shape"},
    {"llama3-8b", 32, 4096, 14336, 32, 8, "swiglu", "rmsnorm", "Llama 3 8B's shape (GQA 8)"},
    {"llama-70b", 80, 8192, 28672, 64, 8, "swiglu", "rmsnorm", "Llama 2 70B's shape (GQA 8)"},
};

std::string preset_names() {
  std::string out;
  for (const Preset& p : kPresets) out += std::string(out.empty() ? "" : ", ") + p.name;
  return out;
}

void set_if_zero(int64_t& value, int64_t preset) {
  if (value == 0) value = preset;
}

}  // namespace

void add_plan_options(CLI::App& app, PlanArgs& a) {
  app.add_flag("--plan", a.plan,
               "plan a training step: per-rank memory and collectives of a TransformerLayer "
               "stack on --mesh under --rules/--mesh-resource, without running it");
  app.add_option(
      "--model", a.model,
      "--plan: a preset shape (" + preset_names() + "); --layers/--hidden/... override its fields");
  app.add_option("--config", a.config,
                 "--plan: a Hugging Face config.json of a family te-cpp builds: plans te-train's "
                 "step of that model instead (embedding, layers, head, loss, te::optim::AdamW "
                 "with fp32 masters; te-train --plan's figures), --batch rows of --seqlen tokens "
                 "a micro-batch; --model and the shape options do not apply. For te-train's "
                 "layout under tp, add --rules vocab=AXIS --extend (te-train splits the "
                 "vocabulary over the tensor-parallel axis)");
  app.add_option("--micro-batches", a.micro_batches,
                 "--plan --config: micro-batches of a step (gradient accumulation; default 1)");
  app.add_option("--zero-axis", a.zero_axis,
                 "--plan --config: ZeRO-1, AdamW's state split over this mesh axis");
  app.add_option("--layers", a.layers, "--plan: TransformerLayers in the stack");
  app.add_option("--hidden", a.hidden, "--plan: hidden size");
  app.add_option("--ffn", a.ffn, "--plan: MLP hidden size");
  app.add_option("--heads", a.heads, "--plan: attention heads");
  app.add_option("--kv-heads", a.kv_heads, "--plan: key/value heads (GQA; 0: as --heads)");
  app.add_option("--activation", a.activation, "--plan: MLP activation, e.g. gelu, swiglu");
  app.add_option("--norm", a.norm, "--plan: layernorm or rmsnorm");
  app.add_option("--batch", a.batch, "--plan: global batch (default 8)");
  app.add_option("--seqlen", a.seqlen, "--plan: sequence length (default 2048)");
  app.add_option(
      "--mesh", a.mesh,
      "the mesh, e.g. data=64,model=16: --plan's ranks (default: one); with AXES, the axis sizes "
      "TE's table reads (a role is active only on an axis of more than one device)");
  app.add_option("--dtype", a.dtype, "--plan: fp32, bf16 (default) or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--fp8", a.fp8, "--plan: FP8 GEMMs with a recipe: " + te::fp8::recipe_summary())
      ->check(CLI::IsMember(te::fp8::recipe_names()));
  app.add_option("--optimizer", a.optimizer, "--plan: adam (default) or sgd")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_flag("--sequence-parallel", a.sequence_parallel,
               "--plan: sequence parallelism (with a tpsp MeshResource or seqlen_tp rules)");
  app.add_option("--cp-comm-type", a.cp_comm_type,
                 "--plan: context parallelism (p2p, all_gather, a2a or a2a+p2p): attention over a "
                 "sequence split over the mesh axis the rules give seqlen_cp (MeshResource cp; "
                 "a2a+p2p: two axes, --rules seqlen_cp=(RING,A2A))")
      ->check(CLI::IsMember(te::nn::te_names<te::nn::CpCommType>()));
  app.add_option("--rank", a.rank, "--plan: the rank to plan for (default 0)");
  app.add_flag("--json", a.json, "--plan: print JSON instead of a table");
}

LayoutScopes::LayoutScopes(const std::string& rules_text, const std::string& resource_text,
                           bool extend, const std::string& mesh_text) {
  if (!mesh_text.empty()) mesh.emplace(te::parse_mesh_shape(mesh_text));
  if (!resource_text.empty()) resource.emplace(te::parse_mesh_resource(resource_text));
  rules = te::parse_axis_rules(rules_text);
  if (extend) rules = te::extend_logical_axis_rules(rules);
  if (!rules.empty()) rules_scope.emplace(rules);
}

namespace {

at::ScalarType dtype_of(const PlanArgs& a) {
  return a.dtype == "fp32" ? at::kFloat : a.dtype == "fp16" ? at::kHalf : at::kBFloat16;
}

int print(const PlanArgs& a, const te::nn::Plan& plan, const std::string& what) {
  if (a.json) {
    std::cout << plan.to_json() << "\n";
    return 0;
  }
  std::cout << what << ", batch " << a.batch << ", seqlen " << a.seqlen << ", " << a.dtype
            << (a.fp8.empty() ? "" : ", FP8 " + a.fp8) << "\n"
            << plan.table() << "planned in " << plan.planning_seconds << " s\n";
  return 0;
}

// --config: te-train's step of a Hugging Face model (te::train::plan_lm_step).
int run_config_plan(const PlanArgs& a) {
  TE_CHECK(a.model == "custom" && a.layers == 0 && a.hidden == 0 && a.ffn == 0 && a.heads == 0,
           "--plan: --config gives the model; drop --model, --layers, --hidden, --ffn and "
           "--heads");
  TE_CHECK(a.optimizer == "adam", "--plan --config plans te-train's AdamW; drop --optimizer ",
           a.optimizer);
  std::ifstream in(a.config);
  TE_CHECK(in.good(), "--config: cannot read '", a.config, "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const te::hf::CausalLMConfig config = te::hf::parse_causal_lm_config(text, a.config);
  te::train::TrainerOptions options;
  options.zero_axis = a.zero_axis;
  if (!a.fp8.empty()) options.fp8 = te::fp8::recipe_named(a.fp8);
  te::train::LmStepShape shape;
  shape.micro_batch = a.batch;
  shape.seq_len = a.seqlen;
  shape.micro_batches = a.micro_batches;
  te::nn::PlanStepOptions where;
  if (!a.mesh.empty()) {
    const te::MeshShape mesh = te::parse_mesh_shape(a.mesh);
    where.mesh_shape = mesh.sizes;
    where.mesh_axes = mesh.names;
  }
  where.rank = a.rank;
  const te::nn::Plan plan = te::train::plan_lm_step(config, dtype_of(a), options, shape, where);
  return print(a, plan,
               "te-train's step of " + a.config + " (" + config.model_type + ", " +
                   std::to_string(config.num_hidden_layers) + " layers), " +
                   std::to_string(a.micro_batches) + " micro-batch(es)" +
                   (a.zero_axis.empty() ? "" : ", ZeRO-1 over '" + a.zero_axis + "'"));
}

}  // namespace

int run_plan(const PlanArgs& a, const LayoutScopes& layout) {
  TE_CHECK(a.mesh.empty() || layout.resource || layout.rules_scope,
           "--plan with --mesh needs --rules or --mesh-resource to say how the model shards on "
           "it, e.g. --mesh-resource dp=data,tp=model");
  if (!a.config.empty()) return run_config_plan(a);
  TE_CHECK(a.micro_batches == 1 && a.zero_axis.empty(),
           "--plan: --micro-batches and --zero-axis plan te-train's step; give --config");
  PlanArgs args = a;
  if (args.model != "custom") {
    const Preset* preset = nullptr;
    for (const Preset& p : kPresets) {
      if (args.model == p.name) preset = &p;
    }
    TE_CHECK(preset != nullptr, "--model '", args.model, "' is not one of: ", preset_names(),
             " (or give --layers, --hidden, --ffn and --heads)");
    set_if_zero(args.layers, preset->layers);
    set_if_zero(args.hidden, preset->hidden);
    set_if_zero(args.ffn, preset->ffn);
    set_if_zero(args.heads, preset->heads);
    set_if_zero(args.kv_heads, preset->kv_heads);
    if (args.activation.empty()) args.activation = preset->activation;
    if (args.norm.empty()) args.norm = preset->norm;
  }
  TE_CHECK(args.layers > 0 && args.hidden > 0 && args.ffn > 0 && args.heads > 0,
           "--plan needs the model's shape: --model (", preset_names(),
           ") or --layers, --hidden, --ffn and --heads, each positive");
  if (args.activation.empty()) args.activation = "gelu";
  if (args.norm.empty()) args.norm = "layernorm";

  te::nn::TransformerLayerOptions layer(args.hidden, args.ffn, args.heads);
  layer.mlp_activations({args.activation});
  layer.self_attention().enable_sequence_parallel(args.sequence_parallel);
  layer.self_attention().layernorm().layernorm_type(args.norm);
  layer.self_attention().attention().num_gqa_groups(args.kv_heads);
  if (!args.cp_comm_type.empty()) {
    // (with the layer's attention dropout, p2p and all_gather plan the unfused blocks)
    layer.self_attention().attention().cp_comm_type(args.cp_comm_type);
  }
  te::nn::PlanOptions options(layer, args.layers, args.batch, args.seqlen);
  if (!args.mesh.empty()) {
    const te::MeshShape mesh = te::parse_mesh_shape(args.mesh);
    options.mesh_shape(mesh.sizes).mesh_axes(mesh.names);
  }
  options.dtype(dtype_of(args));
  if (!args.fp8.empty()) options.fp8(te::fp8::recipe_named(args.fp8));
  options.optimizer(args.optimizer).rank(args.rank);

  std::string what = std::to_string(args.layers) + " x TransformerLayer(hidden " +
                     std::to_string(args.hidden) + ", ffn " + std::to_string(args.ffn) +
                     ", heads " + std::to_string(args.heads);
  if (args.kv_heads > 0) what += ", kv heads " + std::to_string(args.kv_heads);
  what += ", " + args.activation + ", " + args.norm + "), " + args.optimizer;
  if (!args.cp_comm_type.empty()) what += ", cp_comm_type " + args.cp_comm_type;
  return print(args, te::nn::plan(options), what);
}
