#pragma once

// A decoder family as te::hf's loaders use it (the public face is te/hf/families.h): what it
// reads from config.json, its checkpoint's tensors under Hugging Face's names (WeightMap), the
// tensors saved beside them that are not weights, and llama.cpp's names for them in a GGUF file.
// Each family is one file in this folder defining its Family, listed by one line in list.h.

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../json_fields.h"
#include "te/hf/config.h"
#include "te/hf/families.h"
#include "te/hf/gguf.h"
#include "te/hf/weights.h"

namespace te::hf::detail {

/// A mixture of experts' stacked tensor: llama.cpp's blk.N.<gguf> [experts, rows, cols] (a bias
/// [experts, cols]) holds Hugging Face's model.layers.N.<prefix><e><suffix> [rows, cols] ([cols])
/// of each expert e ("mlp.experts.", ".gate_proj.weight", "ffn_gate_exps.weight").
struct GgufExperts {
  std::string prefix, suffix, gguf;
};

/// A checkpoint tensor's Hugging Face name and its llama.cpp name in a GGUF file: whole names,
/// and the parts after "model.layers.N." / "blk.N."; the experts' stacked tensors; the layer
/// tensors Hugging Face keeps as one row [1, n] that llama.cpp's converters wrote as [n] (Qwen2-
/// MoE's shared_expert_gate.weight; the current converter keeps [1, n]: both are read).
struct GgufNames {
  std::vector<std::pair<std::string, std::string>> global, layer;
  std::vector<GgufExperts> experts;
  std::set<std::string> one_row;
};

/// A GGUF file's metadata keys of the family's architecture ("gemma2." ...), as gguf_model.cpp
/// reads them: each key read is remembered, and one never read is refused.
struct GgufKeys {
  virtual ~GgufKeys() = default;
  virtual std::optional<int64_t> integer(const std::string& key) = 0;
  virtual std::optional<double> number(const std::string& key) = 0;
  /// te::Error naming the file and the architecture's key.
  [[noreturn]] virtual void fail(const std::string& key, const std::string& message) const = 0;
};

struct Family {
  FamilyInfo info;
  /// Reads config.json's fields other than model_type, architectures and dtype into `config`
  /// (model_type already set). Every field it does not read is refused unless `metadata` or
  /// kMetadata names it.
  void (*read_config)(Fields& fields, CausalLMConfig& config) = nullptr;
  /// Fields of this family's config.json that cannot change the model (a task head's, ...).
  std::set<std::string> metadata;
  /// te parameter -> checkpoint tensors (Hugging Face's names and layout).
  WeightMap (*weight_map)(const CausalLMConfig& config) = nullptr;
  /// Checkpoints saved from the base model (without the LM head) name their tensors without
  /// this prefix of the weight map's ("transformer." for GPT-2; "" when there is no such form).
  std::string base_prefix;
  /// Whether a checkpoint tensor is not a weight (a buffer saved with them: a causal mask, RoPE
  /// tables); `prefix` is the weight names' prefix in this checkpoint ("" or base_prefix).
  bool (*derived)(const std::string& name, const std::string& prefix) = nullptr;
  /// llama.cpp's names (nullptr: te-cpp reads no GGUF file of this family).
  const GgufNames* gguf = nullptr;
  /// llama.cpp's converter stores each head's query and key rows interleaved (pairs 2i, 2i + 1
  /// where Hugging Face has halves i, i + d/2): Llama's permute, undone on reading.
  bool gguf_interleaved_qk = false;
  /// The GGUF key attention.sliding_window is read past: llama.cpp disables the window of this
  /// family's files (Phi-3) and transformers' GGUF loader does not read it, so both attend fully.
  bool gguf_ignores_sliding_window = false;
  /// llama.cpp's converter stores each norm weight plus one (Gemma's RMSNorms scale by 1 +
  /// weight, llama.cpp's by the weight): one is taken off on reading, as transformers'
  /// Gemma2TensorProcessor does.
  bool gguf_norms_plus_one = false;
  /// The family's own part of a GGUF file's config, after the shared keys (sizes, RoPE, norm
  /// epsilon) and tensors are read; nullptr: none.
  void (*read_gguf_config)(GgufKeys& keys, CausalLMConfig& config) = nullptr;
  /// Another family's GGUF architecture whose files with experts (`<arch>.expert_count`) are
  /// this family's: llama.cpp's converter writes Mixtral as "llama". "" for none.
  std::string gguf_experts_of;
  /// The weight map over a GGUF file's tensors (named as `gguf` names them) where llama.cpp
  /// keeps them in another layout than the checkpoint's: gpt-oss's fused experts split expert by
  /// expert. nullptr: weight_map's.
  WeightMap (*gguf_weight_map)(const CausalLMConfig& config) = nullptr;
};

/// The weight map of a GGUF file of `family` (gguf_weight_map, else weight_map).
inline WeightMap gguf_file_weight_map(const Family& family, const CausalLMConfig& config) {
  return (family.gguf_weight_map ? family.gguf_weight_map : family.weight_map)(config);
}

/// The family of config.json's model_type, nullptr when none is registered.
const Family* find_family(const std::string& model_type);
/// The family of a config te-cpp built (te::Error naming `where` and the registered families
/// when its model_type is none of them: a config made by hand).
const Family& family_of(const CausalLMConfig& config, const std::string& where);
/// The family of a GGUF file's general.architecture (of its variant with experts when
/// `experts`: the file has `<arch>.expert_count`), nullptr when none reads it.
const Family* find_gguf_family(const std::string& architecture, bool experts);
/// find_gguf_family of a file's header (defined in gguf_model.cpp).
const Family* find_gguf_family(const GgufHeader& header);

// Each family's definition (one file each), declared by list.h.
#define TE_HF_FAMILY(name) const Family& name##_family();
#include "list.h"
#undef TE_HF_FAMILY

}  // namespace te::hf::detail
