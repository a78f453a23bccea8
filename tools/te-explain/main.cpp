// te-explain: shows how logical axis names resolve to mesh axes under user rules, TE's default
// table, or both, and why each rule applied or was skipped.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "plan_command.h"
#include "te/nn.h"
#include "te/sharding.h"

namespace {

// "batch,seqlen,_" -> {"batch", "seqlen", nullopt}
te::LogicalAxes parse_axes(const std::string& text) {
  te::LogicalAxes axes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item == "_" || item == "None") {
      axes.emplace_back(std::nullopt);
    } else {
      TE_CHECK(!item.empty(), "axes \"", text,
               "\": an empty name; write _ for an unnamed dim, e.g. batch,_,heads");
      axes.emplace_back(item);
    }
  }
  return axes;
}

// What a TransformerLayer declares: the constraints one forward resolves (its activations, in
// the order first met) and its parameters' axes, read from a small sequence-parallel layer, so
// this listing follows the module.
struct Declared {
  std::vector<te::LogicalAxes> activations;
  std::vector<std::pair<std::string, te::LogicalAxes>> parameters;
};

const Declared& transformer_constraints() {
  static const Declared declared = [] {
    Declared d;
    // Unfused attention, so the attention weights' constraint runs in every build.
    te::nn::TransformerLayerOptions options(64, 128, 4);
    options.self_attention().enable_sequence_parallel(true);
    options.self_attention().attention().fused(false);
    te::nn::TransformerLayer layer(options);
    layer->eval();
    te::ConstraintTrace trace;
    layer(at::zeros({2, 8, 64}));
    d.activations = trace.distinct();
    std::vector<te::LogicalAxes> seen;
    for (const auto& [name, axes] : te::nn::named_parameter_axes(*layer)) {
      if (std::find(seen.begin(), seen.end(), axes) != seen.end()) continue;
      seen.push_back(axes);
      d.parameters.emplace_back(name, axes);
    }
    return d;
  }();
  return declared;
}

void print_layout(const char* title, const te::MeshResource& resource) {
  te::MeshResourceScope scope(resource);
  const Declared& d = transformer_constraints();
  std::cout << title << "  " << te::to_string(resource) << "\n";
  std::cout << "  activations (one forward):\n";
  for (const te::LogicalAxes& axes : d.activations) {
    std::cout << "    " << te::to_string(axes) << " -> "
              << te::to_string(*te::resolve_logical_axes(axes)) << "\n";
  }
  std::cout << "  parameters (one of each kind):\n";
  for (const auto& [name, axes] : d.parameters) {
    std::cout << "    " << name << std::string(name.size() < 36 ? 36 - name.size() : 1, ' ')
              << te::to_string(axes) << " -> " << te::to_string(*te::resolve_logical_axes(axes))
              << "\n";
  }
}

int demo() {
  // The table fallback warns once per process. Let it warn here, before any of the table is
  // printed: stderr is unbuffered and stdout is not, so a warning raised by the first row would
  // land in the middle of the table.
  {
    te::MeshResourceScope resource(te::parse_mesh_resource("dp=data"));
    te::resolve_logical_axes({"batch"});
  }
  std::cerr.flush();
  transformer_constraints();  // read from the module before anything is printed
  std::cout << "How a TransformerLayer's logical constraints resolve under each parallel layout\n"
               "(TE's default table from the MeshResource alone):\n\n";
  print_layout("data parallel", te::parse_mesh_resource("dp=data"));
  print_layout("FSDP", te::parse_mesh_resource("fsdp=fsdp"));
  print_layout("tensor parallel", te::parse_mesh_resource("tp=model"));
  print_layout("tensor + sequence parallel", te::parse_mesh_resource("tpsp=model"));
  print_layout("DP x TP", te::parse_mesh_resource("dp=data,tp=model"));

  std::cout << "\nUser rules extended with TE's table (the preferred route):\n";
  te::MeshResourceScope resource(te::parse_mesh_resource("dp=data,tp=model"));
  const te::AxisRules rules =
      te::extend_logical_axis_rules(te::parse_axis_rules("embed=model,vocab=(data,model)"));
  std::cout << "    rules: " << te::to_string(rules) << "\n\n";
  std::cout << te::explain_logical_axes({"batch", "vocab", "embed"}, rules) << "\n";

  std::cout << "A logical name used twice is rejected (TE's SEQLEN bug):\n";
  try {
    te::logical_to_mesh_axes({"batch", "heads", "seqlen", "seqlen"}, rules);
  } catch (const te::Error& e) {
    std::cout << "    te::Error: " << e.what() << "\n";
  }
  return 0;
}

// Resolves each AXES argument as with_sharding_constraint would under `layout` and prints it.
void resolve_each(const std::vector<std::string>& axes_args, const LayoutScopes& layout,
                  const std::string& fallback_text) {
  const te::AxisRules& rules = layout.rules;
  const te::RulesFallback fallback = fallback_text == "raise" ? te::RulesFallback::kRaiseError
                                     : fallback_text == "none"
                                         ? te::RulesFallback::kNoConstraint
                                         : te::RulesFallback::kAxisIsUnsharded;
  for (const std::string& text : axes_args) {
    const te::LogicalAxes axes = parse_axes(text);
    const auto spec = te::resolve_logical_axes(axes, fallback);
    if (!spec) {
      std::cout << te::to_string(axes) << " -> no constraint"
                << (rules.empty() && !layout.resource ? " (neither --rules nor --mesh-resource)"
                                                      : "")
                << "\n";
      continue;
    }
    // The explanation's first line is the resolution itself.
    std::cout << te::explain_logical_axes(axes,
                                          !rules.empty() ? rules : te::te_default_axis_rules());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "te-explain: show how logical axis names resolve to mesh axes.\n\n"
      "With no AXES, prints how a TransformerLayer's constraints resolve under data, FSDP,\n"
      "tensor, sequence and DP x TP layouts. With AXES, resolves each (comma-separated, _ for an\n"
      "unnamed dim) the way with_sharding_constraint would: --rules when given, else TE's\n"
      "default table from --mesh-resource, else no constraint.\n\n"
      "Examples:\n"
      "  te-explain --rules 'batch=data,heads=model' batch,seqlen,heads,_\n"
      "  te-explain --mesh-resource dp=data,tpsp=model batch,seqlen_tp,hidden\n"
      "  te-explain --mesh-resource dp=data --rules embed=model --extend batch,embed\n"
      "  te-explain --mesh-resource dp=data,fsdp=fsdp --mesh data=2,fsdp=1 batch,w_fsdp\n"
      "    (--mesh gives the axis sizes TE's table reads: fsdp on one device is inactive, so\n"
      "    batch goes to dp)\n\n"
      "With --plan, plans one training step of a TransformerLayer stack on --mesh instead: per\n"
      "rank, the parameter, gradient, optimizer-state and activation bytes, and the collectives "
      "by\n"
      "kind and mesh axis with their bytes (te::nn::plan; nothing runs, any mesh size):\n"
      "  te-explain --plan --model llama-7b --mesh data=64,model=16 --mesh-resource "
      "dp=data,tp=model\n"
      "  te-explain --plan --model te-encoder --batch 64 --seqlen 32 --mesh data=2 \\\n"
      "      --mesh-resource dp=data --dtype fp32 --json\n"
      "With --config, te-train's step of a Hugging Face model (te-train --plan's figures):\n"
      "  te-explain --plan --config SmolLM2-135M/config.json --batch 4 --seqlen 2048 \\\n"
      "      --micro-batches 8 --mesh data=8 --mesh-resource dp=data --zero-axis data"};
  PlanArgs plan_args;
  std::vector<std::string> axes_args;
  std::string rules_text;
  std::string resource_text;
  bool extend = false;
  std::string fallback_text = "unsharded";
  app.add_option("AXES", axes_args, "logical axes of one tensor each, e.g. batch,seqlen,heads,_");
  app.add_option("--rules", rules_text,
                 "user rules in priority order, e.g. 'batch=(data,fsdp),heads=model,hidden='");
  app.add_option("--mesh-resource", resource_text,
                 "parallelism roles, e.g. 'dp=data,tp=model' (dp tp tpsp fsdp pp cp ep)");
  app.add_flag("--extend", extend,
               "append TE's default entries to --rules (needs --mesh-resource)");
  app.add_option("--fallback", fallback_text,
                 "a named dim no rule assigns: unsharded (default), raise, none (no constraint)")
      ->check(CLI::IsMember({"unsharded", "raise", "none"}));
  add_plan_options(app, plan_args);
  CLI11_PARSE(app, argc, argv);

  try {
    if (plan_args.plan) {
      if (!axes_args.empty()) {
        std::cerr << "te-explain: --plan takes no AXES; see --help\n";
        return 2;
      }
      const LayoutScopes layout(rules_text, resource_text, extend, plan_args.mesh);
      return run_plan(plan_args, layout);
    }
    if (axes_args.empty()) {
      if (!rules_text.empty() || !resource_text.empty() || extend) {
        std::cerr << "te-explain: --rules/--mesh-resource/--extend need AXES to resolve; see "
                     "--help\n";
        return 2;
      }
      return demo();
    }
    const LayoutScopes layout(rules_text, resource_text, extend, plan_args.mesh);
    resolve_each(axes_args, layout, fallback_text);
  } catch (const te::Error& e) {
    std::cerr << "te-explain: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // LibTorch's own errors under --plan
    std::cerr << "te-explain: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
