#pragma once

// The decoder families te::hf::load_causal_lm builds, as registered: each family is one file
// under hf/src/families/ (its config.json fields, its checkpoint's tensor names, llama.cpp's
// names for them in a GGUF file and how its rows differ there), listed by one line in
// hf/src/families/list.h. Errors, --help and the docs read the supported list from here.
//
// Example:
//   for (const te::hf::FamilyInfo& f : te::hf::causal_lm_families()) std::cout << f.model_type;

#include <string>
#include <vector>

namespace te::hf {

/// One registered decoder family.
struct FamilyInfo {
  std::string model_type;    ///< config.json's model_type: "llama"
  std::string architecture;  ///< the class config.json's architectures names: "LlamaForCausalLM"
  /// GGUF's general.architecture for the same model ("llama"); "" when the family has none of
  /// its own (none te-cpp reads, or Mixtral's, which llama.cpp writes as "llama" with experts).
  std::string gguf_architecture;
  std::string title;  ///< the family as people name it: "Llama (2, 3, SmolLM2)"
};

/// Every registered decoder family, in registration order.
const std::vector<FamilyInfo>& causal_lm_families();

/// The registered model_types, "llama, mistral, ..." (gguf: the GGUF architectures instead,
/// families without one left out), for messages and --help.
std::string causal_lm_family_names(bool gguf = false);

/// The families as people name them, "Llama (2, 3, SmolLM2), Mistral, ...", for --help.
std::string causal_lm_family_titles();

}  // namespace te::hf
