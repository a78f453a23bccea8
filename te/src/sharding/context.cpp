#include "te/sharding/context.h"

#include <algorithm>
#include <atomic>
#include <iostream>
#include <mutex>
#include <utility>
#include <vector>

#include "te/error.h"
#include "te/scope_stack.h"

namespace te {

namespace {

// The scopes in force on this thread (te/scope_stack.h); a null value masks the outer ones
// ("none here").
ScopeStack<const AxisRules*>& rules_stack() {
  thread_local ScopeStack<const AxisRules*> stack;
  return stack;
}

ScopeStack<const MeshResource*>& resource_stack() {
  thread_local ScopeStack<const MeshResource*> stack;
  return stack;
}

ScopeStack<const MeshShape*>& shape_stack() {
  thread_local ScopeStack<const MeshShape*> stack;
  return stack;
}

// Process-wide warning state: the handler (guarded) and the once-per-process flag.
struct WarningState {
  std::mutex mutex;
  WarningHandler handler;
  std::atomic<bool> te_table_warned{false};
};

WarningState& warning_state() {
  static WarningState state;
  return state;
}

void default_warning(std::string_view message) {
  std::cerr << "te: warning: " << message << std::endl;
}

void emit_warning(std::string_view message) {
  WarningHandler handler;
  {
    std::lock_guard<std::mutex> lock(warning_state().mutex);
    handler = warning_state().handler;
  }
  if (handler) {
    handler(message);
  } else {
    default_warning(message);
  }
}

void warn_te_table_once() {
  if (warning_state().te_table_warned.exchange(true)) return;
  emit_warning(
      "resolving logical axes with Transformer Engine's built-in table (batch, seqlen, heads, "
      "hidden, w_fsdp, w_tp, ...) derived from the MeshResource is deprecated: no AxisRulesScope "
      "is open. Open a te::AxisRulesScope with your own rules, and call "
      "te::extend_logical_axis_rules(rules) to add TE's names to them.");
}

std::string quoted(const std::string& s) { return "'" + s + "'"; }

}  // namespace

// ---------------------------------------------------------------------------------------------

AxisRulesScope::AxisRulesScope(AxisRules rules) : rules_(std::move(rules)) {
  validate_axis_rules(rules_);
  rules_stack().push(this, &rules_);
}

AxisRulesScope::~AxisRulesScope() { rules_stack().pop(this); }

const AxisRules& current_axis_rules() {
  static const AxisRules kNone;
  const AxisRules* top = rules_stack().top_or(nullptr);
  return top ? *top : kNone;
}

// ---------------------------------------------------------------------------------------------

std::string to_string(const MeshResource& r) {
  std::string out = "MeshResource(";
  bool first = true;
  auto add = [&](const char* role, const std::optional<std::string>& axis) {
    if (!axis) return;
    out += (first ? "" : ", ") + std::string(role) + "=" + quoted(*axis);
    first = false;
  };
  for (const MeshRole& role : kMeshRoles) add(role.name, r.*role.axis);
  return out + ")";
}

void validate_mesh_resource(const MeshResource& r) {
  for (const MeshRole& role : kMeshRoles) {
    const auto& axis = r.*role.axis;
    TE_CHECK(!axis || !axis->empty(), to_string(r), ": role ", role.name,
             " names the empty mesh axis; leave it unset or name a mesh axis");
  }
  // ep (last) may share a mesh axis with another role (experts over the data axis); the others
  // may not.
  const std::size_t n = std::size(kMeshRoles) - 1;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      const auto& a = r.*kMeshRoles[i].axis;
      const auto& b = r.*kMeshRoles[j].axis;
      TE_CHECK(!(a && b && *a == *b), to_string(r), ": roles ", kMeshRoles[j].name, " and ",
               kMeshRoles[i].name, " both name mesh axis ", quoted(*a),
               "; give each parallelism role its own mesh axis");
    }
  }
}

MeshResource parse_mesh_resource(std::string_view text) {
  MeshResource r;
  std::string names;
  for (const MeshRole& role : kMeshRoles)
    names += (names.empty() ? "" : ", ") + std::string(role.name);
  for (const AxisRule& entry : parse_axis_rules(text)) {
    auto it = std::find_if(std::begin(kMeshRoles), std::end(kMeshRoles),
                           [&](const MeshRole& role) { return entry.logical == role.name; });
    TE_CHECK(it != std::end(kMeshRoles), "parse_mesh_resource: unknown role ",
             quoted(entry.logical), " in \"", text, "\"; the roles are ", names);
    TE_CHECK(!(r.*it->axis), "parse_mesh_resource: role ", quoted(entry.logical),
             " given twice in \"", text, "\"; give each role once");
    TE_CHECK(entry.mesh.size() == 1, "parse_mesh_resource: role ", quoted(entry.logical),
             " must name exactly one mesh axis (got ", to_string(entry), "); write e.g. dp=data");
    r.*it->axis = entry.mesh[0];
  }
  validate_mesh_resource(r);
  return r;
}

MeshResourceScope::MeshResourceScope(MeshResource resource) : resource_(std::move(resource)) {
  validate_mesh_resource(resource_);
  resource_stack().push(this, &resource_);
}

MeshResourceScope::~MeshResourceScope() { resource_stack().pop(this); }

std::optional<MeshResource> current_mesh_resource() {
  const MeshResource* top = resource_stack().top_or(nullptr);
  if (!top) return std::nullopt;
  return *top;
}

MeshShapeScope::MeshShapeScope(MeshShape shape) : shape_(std::move(shape)) {
  shape_stack().push(this, &shape_);
}

MeshShapeScope::~MeshShapeScope() { shape_stack().pop(this); }

std::optional<MeshShape> current_mesh_shape() {
  const MeshShape* top = shape_stack().top_or(nullptr);
  if (!top) return std::nullopt;
  return *top;
}

namespace {

// TE's "active" role (transformer_engine/jax/sharding.py at d0067d0, L95-L96 and L56-L62): set,
// and its mesh axis holds more than one device. Unknown sizes (no shape) count as active.
bool role_active(const MeshResource& r, std::optional<std::string> MeshResource::*role,
                 const char* name, const std::optional<MeshShape>& shape) {
  const std::optional<std::string>& axis = r.*role;
  if (!axis) return false;
  if (!shape) return true;
  const std::optional<int64_t> size = shape->size_of(*axis);
  TE_CHECK(size.has_value(), to_string(r), ": role ", name, " names mesh axis ", quoted(*axis),
           ", which the mesh (", shape->to_string(),
           ") does not have; name one of its axes, or leave the role unset");
  return *size > 1;
}

}  // namespace

AxisRules te_default_axis_rules(const MeshResource& r, const std::optional<MeshShape>& shape) {
  validate_mesh_resource(r);
  const bool tp = role_active(r, &MeshResource::tp, "tp", shape);
  const bool tpsp = role_active(r, &MeshResource::tpsp, "tpsp", shape);
  const bool fsdp = role_active(r, &MeshResource::fsdp, "fsdp", shape);
  // With no mesh known TE builds no table at all (sharding.py L84-L86), so nothing to refuse.
  TE_CHECK(!(shape && tp && tpsp), to_string(r),
           ": tp and tpsp are both active (set, on mesh axes of more than one device in ",
           shape ? shape->to_string() : std::string(), "); tensor parallelism (tp) and tensor + ",
           "sequence parallelism (tpsp) exclude each other, as in Transformer Engine: set only "
           "one, or give one a size-1 axis");
  auto axes = [](const std::optional<std::string>& a) { return a ? MeshAxes{*a} : MeshAxes{}; };
  const MeshAxes batch = axes(fsdp ? r.fsdp : r.dp);
  const MeshAxes tensor = axes(tpsp ? r.tpsp : r.tp);
  AxisRules table = {
      {axis::kBatch, batch},         {axis::kSeqlen, {}},    {axis::kSeqlenTp, axes(r.tpsp)},
      {axis::kSeqlenCp, axes(r.cp)}, {axis::kHeads, tensor}, {axis::kHidden, {}},
      {axis::kHiddenTp, tensor},     {axis::kJoined, {}},    {axis::kWNoShard, {}},
      {axis::kWFsdp, axes(r.fsdp)},  {axis::kWTp, tensor},   {axis::kWJoined, {}},
  };
  // te's entry for a mixture of experts' expert dim (TE-JAX's MoE block reads ep_resource
  // directly: jax/flax/moe.py at d0067d0da); absent without an ep role, so the table is TE's.
  // First: where ep shares a mesh axis with tp, an expert kernel's experts take it (each rank
  // its experts, whole), not its mlp dim.
  if (r.ep) table.insert(table.begin(), {axis::kExp, axes(r.ep)});
  return table;
}

AxisRules te_default_axis_rules(const MeshResource& r) {
  return te_default_axis_rules(r, current_mesh_shape());
}

AxisRules te_default_axis_rules() {
  const MeshResource* top = resource_stack().top_or(nullptr);
  TE_CHECK(top != nullptr,
           "te_default_axis_rules: no MeshResource is in scope on this thread; open a "
           "te::MeshResourceScope (or an Fp8Autocast with a MeshResource) first");
  return te_default_axis_rules(*top);
}

AxisRules extend_logical_axis_rules(const AxisRules& rules) {
  const MeshResource* top = resource_stack().top_or(nullptr);
  TE_CHECK(top != nullptr,
           "extend_logical_axis_rules needs a MeshResource in scope to know TE's table; call it "
           "inside a te::MeshResourceScope or an Fp8Autocast that is given a MeshResource");
  validate_axis_rules(rules);
  AxisRules extended = rules;
  for (const AxisRule& te_rule : te_default_axis_rules(*top, current_mesh_shape())) {
    std::vector<const AxisRule*> user;
    for (const AxisRule& r : rules) {
      if (r.logical == te_rule.logical) user.push_back(&r);
    }
    if (user.empty()) {
      extended.push_back(te_rule);
      continue;
    }
    std::string given;
    for (const AxisRule* u : user) given += (given.empty() ? "" : " and ") + to_string(*u);
    TE_CHECK(user.size() == 1 && user[0]->mesh == te_rule.mesh,
             "extend_logical_axis_rules: the rules diverge from TE's on axis ",
             quoted(te_rule.logical), ": given ", given, ", but TE's table under ", to_string(*top),
             " has ", to_string(te_rule),
             "; drop your entry for it, or make it equal to TE's (a single entry)");
  }
  return extended;
}

// ---------------------------------------------------------------------------------------------

const AxisRules* rules_in_effect() {
  const AxisRules* rules = rules_stack().top_or(nullptr);
  if (rules != nullptr && !rules->empty()) return rules;
  const MeshResource* resource = resource_stack().top_or(nullptr);
  if (resource == nullptr) return nullptr;
  // Constraints resolve on every forward: keep this thread's last table.
  struct Table {
    MeshResource resource;
    std::optional<MeshShape> shape;
    AxisRules rules;
  };
  thread_local std::optional<Table> cached;
  const MeshShape* top = shape_stack().top_or(nullptr);
  const bool same_shape =
      cached && (top ? cached->shape && *cached->shape == *top : !cached->shape);
  if (!cached || cached->resource != *resource || !same_shape) {
    std::optional<MeshShape> shape;
    if (top) shape = *top;
    AxisRules rules = te_default_axis_rules(*resource, shape);
    cached = Table{*resource, std::move(shape), std::move(rules)};
  }
  return &cached->rules;
}

namespace {

ScopeStack<ConstraintTrace*>& trace_stack() {
  thread_local ScopeStack<ConstraintTrace*> stack;
  return stack;
}

}  // namespace

ConstraintTrace::ConstraintTrace() { trace_stack().push(this, this); }
ConstraintTrace::~ConstraintTrace() { trace_stack().pop(this); }

std::vector<LogicalAxes> ConstraintTrace::distinct() const {
  std::vector<LogicalAxes> out;
  for (const LogicalAxes& a : axes_) {
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  }
  return out;
}

std::optional<PartitionSpec> resolve_logical_axes(const LogicalAxes& axes, RulesFallback fallback) {
  trace_stack().for_each([&](ConstraintTrace* t) { t->axes_.push_back(axes); });
  const AxisRules* rules = rules_in_effect();
  if (rules == nullptr) {
    // No constraint, but a malformed one is still a bug in the caller: report it on one
    // device too, not only once the model runs sharded.
    validate_logical_axes(axes);
    return std::nullopt;
  }
  const AxisRules* user = rules_stack().top_or(nullptr);
  if (user == nullptr || user->empty()) warn_te_table_once();
  const Resolution res = resolve_with_rules(axes, *rules);
  if (fallback != RulesFallback::kAxisIsUnsharded) {
    const std::vector<std::string> unmatched = res.unassigned();
    if (!unmatched.empty()) {
      if (fallback == RulesFallback::kNoConstraint) return std::nullopt;
      std::string names;
      for (const std::string& n : unmatched) names += (names.empty() ? "" : ", ") + quoted(n);
      TE_FAIL("logical axes ", to_string(axes), ": ", names,
              unmatched.size() == 1 ? " matches" : " match", " no applicable rule in [",
              to_string(*rules),
              "]; add a rule for each (name= pins it replicated), or use "
              "RulesFallback::kAxisIsUnsharded");
    }
  }
  return res.spec();
}

// ---------------------------------------------------------------------------------------------

WarningHandler set_warning_handler(WarningHandler handler) {
  std::lock_guard<std::mutex> lock(warning_state().mutex);
  WarningHandler previous = std::move(warning_state().handler);
  warning_state().handler = std::move(handler);
  return previous;
}

void reset_deprecation_warnings() { warning_state().te_table_warned.store(false); }

// ---------------------------------------------------------------------------------------------

ShardingContext capture_sharding_context() {
  ShardingContext context;
  if (const AxisRules* rules = rules_stack().top_or(nullptr)) context.rules = *rules;
  if (const MeshResource* resource = resource_stack().top_or(nullptr))
    context.mesh_resource = *resource;
  context.mesh_shape = current_mesh_shape();
  return context;
}

ShardingContextScope::ShardingContextScope(const ShardingContext& context)
    : rules_(context.rules.value_or(AxisRules{})),
      resource_(context.mesh_resource),
      shape_(context.mesh_shape) {
  validate_axis_rules(rules_);
  if (resource_) validate_mesh_resource(*resource_);
  // Push both, even when empty: the captured context replaces whatever this thread had.
  rules_stack().push(this, &rules_);
  resource_stack().push(this, resource_ ? &*resource_ : nullptr);
  shape_stack().push(this, shape_ ? &*shape_ : nullptr);
}

ShardingContextScope::~ShardingContextScope() {
  shape_stack().pop(this);
  resource_stack().pop(this);
  rules_stack().pop(this);
}

void warn(std::string_view message) { emit_warning(message); }

}  // namespace te
