#pragma once

// te-explain --plan: one rank's memory and collectives of a training step (te::nn::plan, or
// te::train::plan_lm_step for a Hugging Face config).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "te/sharding.h"

/// The layout te-explain's options describe, in scope while alive: --mesh-resource, and --rules
/// (extended with TE's table under --extend).
struct LayoutScopes {
  LayoutScopes(const std::string& rules_text, const std::string& resource_text, bool extend,
               const std::string& mesh_text);
  std::optional<te::MeshShapeScope> mesh;  ///< --mesh: the axis sizes TE's table reads
  std::optional<te::MeshResourceScope> resource;
  te::AxisRules rules;
  std::optional<te::AxisRulesScope> rules_scope;
};

struct PlanArgs {
  bool plan = false;
  std::string model = "custom";
  std::string config;  // --config: a Hugging Face config.json, planned as te-train's step
  int64_t micro_batches = 1;
  std::string zero_axis;
  int64_t layers = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0;
  std::string activation;
  std::string norm;
  int64_t batch = 8, seqlen = 2048;
  std::string mesh;
  std::string dtype = "bf16";
  std::string fp8;
  std::string optimizer = "adam";
  bool sequence_parallel = false;
  std::string cp_comm_type;  ///< context parallelism's strategy; empty: none
  int rank = 0;
  bool json = false;
};

/// Adds --plan and the options it reads to `app`.
void add_plan_options(CLI::App& app, PlanArgs& args);
/// Prints the plan the options describe under `layout`. Returns the exit status (te::Error
/// propagates).
int run_plan(const PlanArgs& args, const LayoutScopes& layout);
