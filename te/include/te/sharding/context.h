#pragma once

// Scoped, thread-local sharding context: the user's rules (Flax's logical_axis_rules) and the
// MeshResource (Transformer Engine's dp/tp/tpsp/fsdp/pp/cp/ep roles), and how a logical
// constraint is resolved against them.
//
// Scopes are RAII guards on a per-thread stack: the innermost one is in force, and it replaces
// (does not merge with) the ones around it, as Flax's context manager does. A new thread starts
// with no scope at all; capture_sharding_context() / ShardingContextScope carry the current one
// into a worker thread.

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "te/sharding/axis_rules.h"
#include "te/sharding/mesh_shape.h"

namespace te {

// ---------------------------------------------------------------------------------------------
// User rules

/// Makes `rules` the rules in force on this thread until the guard is destroyed.
///
/// Example:
///   te::AxisRulesScope rules(te::parse_axis_rules("batch=data,heads=model"));
///   auto spec = te::resolve_logical_axes({"batch", "seqlen", "heads"});
class AxisRulesScope {
 public:
  explicit AxisRulesScope(AxisRules rules);
  /// AxisRulesScope scope({{"batch", {"data"}}, {"heads", {"model"}}});
  explicit AxisRulesScope(std::initializer_list<AxisRule> rules)
      : AxisRulesScope(AxisRules(rules)) {}
  ~AxisRulesScope();
  AxisRulesScope(const AxisRulesScope&) = delete;
  AxisRulesScope& operator=(const AxisRulesScope&) = delete;

 private:
  AxisRules rules_;
};

/// The rules of the innermost AxisRulesScope on this thread; empty when there is none.
const AxisRules& current_axis_rules();

// ---------------------------------------------------------------------------------------------
// MeshResource and Transformer Engine's default table

/// Which mesh axis plays which parallelism role. Unset roles are not used.
struct MeshResource {
  std::optional<std::string> dp;    ///< data parallel: shards the batch
  std::optional<std::string> tp;    ///< tensor parallel (Megatron): shards heads and hidden_tp
  std::optional<std::string> tpsp;  ///< tensor + sequence parallel: also shards seqlen_tp
  std::optional<std::string> fsdp;  ///< fully sharded data parallel: batch and w_fsdp weights
  std::optional<std::string> pp;    ///< pipeline parallel (excluded from amax reduction)
  std::optional<std::string> cp;    ///< context parallel: shards seqlen_cp
  std::optional<std::string> ep;    ///< expert parallel

  friend bool operator==(const MeshResource& a, const MeshResource& b) {
    return a.dp == b.dp && a.tp == b.tp && a.tpsp == b.tpsp && a.fsdp == b.fsdp && a.pp == b.pp &&
           a.cp == b.cp && a.ep == b.ep;
  }
  friend bool operator!=(const MeshResource& a, const MeshResource& b) { return !(a == b); }
};

/// A parallelism role of MeshResource: its name and its member.
struct MeshRole {
  const char* name;
  std::optional<std::string> MeshResource::*axis;
};
/// Every role, in the order printers and parsers use; ep, which may share a mesh axis with
/// another role, last.
inline constexpr MeshRole kMeshRoles[] = {
    {"dp", &MeshResource::dp},     {"tp", &MeshResource::tp}, {"tpsp", &MeshResource::tpsp},
    {"fsdp", &MeshResource::fsdp}, {"pp", &MeshResource::pp}, {"cp", &MeshResource::cp},
    {"ep", &MeshResource::ep}};

/// "MeshResource(dp='data', tp='model')"; unset roles are left out.
std::string to_string(const MeshResource& resource);

/// Reads "dp=data,tp=model" (roles dp, tp, tpsp, fsdp, pp, cp, ep; one mesh axis each). Throws
/// te::Error naming an unknown or repeated role, or a role given a tuple, and validates the result.
MeshResource parse_mesh_resource(std::string_view text);

/// Throws te::Error when a role names the empty string, or when two of dp/fsdp/tp/tpsp/cp/pp name
/// the same mesh axis. (tp and tpsp together are refused where TE refuses them: when both are
/// active, see te_default_axis_rules.)
void validate_mesh_resource(const MeshResource& resource);

/// Makes `resource` the MeshResource in force on this thread until the guard is destroyed.
/// Validates it first (see validate_mesh_resource).
class MeshResourceScope {
 public:
  explicit MeshResourceScope(MeshResource resource);
  ~MeshResourceScope();
  MeshResourceScope(const MeshResourceScope&) = delete;
  MeshResourceScope& operator=(const MeshResourceScope&) = delete;

 private:
  MeshResource resource_;
};

/// The MeshResource of the innermost MeshResourceScope on this thread, if any.
std::optional<MeshResource> current_mesh_resource();

/// Transformer Engine's built-in logical names.
namespace axis {
inline constexpr const char* kBatch = "batch";
inline constexpr const char* kSeqlen = "seqlen";
inline constexpr const char* kSeqlenTp = "seqlen_tp";
inline constexpr const char* kSeqlenCp = "seqlen_cp";
inline constexpr const char* kHeads = "heads";
inline constexpr const char* kHidden = "hidden";
inline constexpr const char* kHiddenTp = "hidden_tp";
inline constexpr const char* kJoined = "joined";
inline constexpr const char* kWNoShard = "w_no_shard";
inline constexpr const char* kWFsdp = "w_fsdp";
inline constexpr const char* kWTp = "w_tp";
inline constexpr const char* kWJoined = "w_joined";
/// The expert dim of a mixture of experts' kernels (TE-JAX's flax/moe.py name): TE's table
/// gives it MeshResource::ep when that role is set (te's entry: TE-JAX's MoE block reads
/// ep_resource itself).
inline constexpr const char* kExp = "exp";
/// Flax's names for an embedding table's dims (not in TE's table: give them rules, e.g.
/// "vocab=model" for a vocabulary-parallel table).
inline constexpr const char* kVocab = "vocab";
inline constexpr const char* kEmbed = "embed";

/// The sequence axis of activations: seqlen_tp under sequence parallelism, else seqlen.
inline const char* seqlen(bool sequence_parallel) {
  return sequence_parallel ? kSeqlenTp : kSeqlen;
}
/// Activations [batch, seq, hidden] (seq as above).
inline LogicalAxes activations(bool sequence_parallel) {
  return {kBatch, seqlen(sequence_parallel), kHidden};
}
/// The default kernel axes of TE's modules: a kernel from hidden into a joined, tensor-parallel
/// output ([hidden, joined, out]: fused QKV, the MLP's first GEMM), and a kernel from the
/// tensor-parallel dim back to hidden ([in, hidden]: attention's output, the MLP's second GEMM).
inline LogicalAxes joined_in_kernel() { return {kWFsdp, kWJoined, kWTp}; }
inline LogicalAxes in_kernel() { return {kWFsdp, kWTp}; }
inline LogicalAxes out_kernel() { return {kWTp, kWFsdp}; }
/// A replicated parameter (layer-norm scales, output biases).
inline LogicalAxes replicated_1d() { return {kWNoShard}; }
}  // namespace axis

// ---------------------------------------------------------------------------------------------
// The mesh whose axis sizes TE's table reads

/// Makes `shape` the mesh whose axis sizes TE's table reads on this thread until the guard is
/// destroyed (nests). te::MeshScope opens one for its mesh, and te::with_sharding_constraint for
/// the DTensor's; te-explain for --mesh.
class MeshShapeScope {
 public:
  explicit MeshShapeScope(MeshShape shape);
  ~MeshShapeScope();
  MeshShapeScope(const MeshShapeScope&) = delete;
  MeshShapeScope& operator=(const MeshShapeScope&) = delete;

 private:
  MeshShape shape_;
};

/// The innermost MeshShapeScope's mesh on this thread, if any.
std::optional<MeshShape> current_mesh_shape();

/// TE's table for `resource` on a mesh of `shape`, as TE-JAX's
/// `get_sharding_map_logic_axis_to_mesh_axis` builds it at d0067d0
/// (transformer_engine/jax/sharding.py L79-L112): a role is *active* when it is set and its
/// mesh axis has more than one device; batch->fsdp if fsdp is active, else dp; seqlen->{},
/// seqlen_tp->tpsp, seqlen_cp->cp; heads, hidden_tp and w_tp->tpsp if tpsp is active, else tp;
/// hidden->{}, joined->{}, w_no_shard->{}, w_fsdp->fsdp, w_joined->{}; and te's one addition,
/// exp->ep, first and only when ep is set (TE-JAX's MoE block takes ep_resource from the
/// MeshResource itself: jax/flax/moe.py; first, so that an expert kernel's experts take an axis
/// ep shares with tp before its mlp dim does). Unset roles give {}.
/// (Before TE 2.8 batch was the (dp, fsdp) tuple.) With no shape (nullopt) every set role counts
/// as active. Throws te::Error when tp and tpsp are both active (TE's
/// `_validate_mesh_resource_configuration`, L54), or when fsdp, tp or tpsp names an axis `shape`
/// lacks (TE asserts the same in `get_mesh_axis_size`).
///
/// Where this table gives one mesh axis to two dims of one constraint (JAX would then reject
/// the PartitionSpec), te resolves it as Flax does: the first dim keeps the axis.
AxisRules te_default_axis_rules(const MeshResource& resource,
                                const std::optional<MeshShape>& shape);

/// TE's table for `resource` on the mesh in scope (current_mesh_shape()).
AxisRules te_default_axis_rules(const MeshResource& resource);

/// The TE table for the MeshResource and mesh in scope; throws te::Error when no MeshResource is.
AxisRules te_default_axis_rules();

/// The user's rules followed by every TE entry the user did not name. A user entry for a TE name
/// must agree with TE's (one entry, same mesh axes); a diverging one throws naming the axis and
/// both values. Needs a MeshResource in scope (open a MeshResourceScope, or an Fp8Autocast with a
/// MeshResource, first).
AxisRules extend_logical_axis_rules(const AxisRules& rules);

// ---------------------------------------------------------------------------------------------
// Resolution of a constraint against the context

/// The rules constraints resolve with on this thread: the user's rules in scope when there are
/// any, else TE's table for the MeshResource in scope, else none (null). Valid until the scopes
/// change.
const AxisRules* rules_in_effect();

/// What a constraint does with a named dim that no rule assigns (Flax's RulesFallback).
enum class RulesFallback {
  kAxisIsUnsharded,  ///< the dim is not sharded
  kRaiseError,       ///< throw te::Error naming every such axis
  kNoConstraint,     ///< drop the whole constraint (resolve returns nullopt)
};

/// The layout a constraint on `axes` asks for in the current context:
///  - user rules in scope: Flax resolution with `fallback`;
///  - otherwise a MeshResource in scope: TE's default table, same algorithm, and a one-time
///    deprecation warning (through the warning handler);
///  - otherwise nullopt (no constraint: single device).
/// A logical name repeated in `axes` throws in every case. This differs from Flax on purpose:
/// Flax's `with_logical_constraint` with no rules returns early and imposes nothing, even for a
/// repeated name; te reports it on one device too, since a repeated name is always a bug in the
/// caller (attention's weights constrained (batch, heads, seqlen, seqlen) was one).
std::optional<PartitionSpec> resolve_logical_axes(
    const LogicalAxes& axes, RulesFallback fallback = RulesFallback::kAxisIsUnsharded);

/// While alive, records the logical axes of every constraint resolved on this thread
/// (resolve_logical_axes, so every with_sharding_constraint), in order: what a module declares
/// when it runs, also a constraint that then fails. te-explain prints a TransformerLayer's from
/// one forward. Traces nest; each sees everything resolved during its life; a trace opens and
/// closes on one thread.
class ConstraintTrace {
 public:
  ConstraintTrace();
  ~ConstraintTrace();
  ConstraintTrace(const ConstraintTrace&) = delete;
  ConstraintTrace& operator=(const ConstraintTrace&) = delete;
  const std::vector<LogicalAxes>& axes() const { return axes_; }
  /// The distinct constraints, in the order first seen.
  std::vector<LogicalAxes> distinct() const;

 private:
  friend std::optional<PartitionSpec> resolve_logical_axes(const LogicalAxes&, RulesFallback);
  std::vector<LogicalAxes> axes_;
};

// ---------------------------------------------------------------------------------------------
// Warnings

/// Receives library warnings (e.g. the deprecated TE-table fallback). The default prints
/// "te: warning: <message>" to stderr.
using WarningHandler = std::function<void(std::string_view message)>;

/// Installs `handler` process-wide (nullptr restores the default) and returns the previous one.
/// Thread-safe; the handler itself may be called from any thread.
WarningHandler set_warning_handler(WarningHandler handler);

/// Sends a library warning to the installed handler (or stderr): a request te-cpp honours after
/// changing it, as Transformer Engine warns for the same request.
void warn(std::string_view message);

/// Makes the next TE-table fallback warn again (the warning is otherwise once per process).
void reset_deprecation_warnings();

// ---------------------------------------------------------------------------------------------
// Carrying the context into worker threads

/// A snapshot of this thread's sharding context.
struct ShardingContext {
  std::optional<AxisRules> rules;  ///< nullopt: no AxisRulesScope was open
  std::optional<MeshResource> mesh_resource;
  std::optional<MeshShape> mesh_shape;  ///< the mesh TE's table reads, if one was in scope
};

/// The rules, MeshResource and mesh shape in force on this thread now.
ShardingContext capture_sharding_context();

/// Re-opens a captured context on the current thread (typically a pool worker) for its lifetime.
/// It replaces whatever that thread had in scope: a context captured with no rules or no
/// MeshResource masks the worker's own.
///
/// Example:
///   auto ctx = te::capture_sharding_context();
///   pool.submit([ctx] { te::ShardingContextScope scope(ctx); model->forward(x); });
class ShardingContextScope {
 public:
  explicit ShardingContextScope(const ShardingContext& context);
  ~ShardingContextScope();
  ShardingContextScope(const ShardingContextScope&) = delete;
  ShardingContextScope& operator=(const ShardingContextScope&) = delete;

 private:
  AxisRules rules_;
  std::optional<MeshResource> resource_;
  std::optional<MeshShape> shape_;
};

/// Wraps `fn` so that it runs inside the sharding context captured now, on whatever thread calls
/// it.
template <typename Fn>
auto bind_sharding_context(Fn fn) {
  return [context = capture_sharding_context(), fn = std::move(fn)](auto&&... args) mutable {
    ShardingContextScope scope(context);
    return fn(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace te
