// The registry of decoder families: list.h's lines, looked up by config.json's model_type or a
// GGUF file's general.architecture. Built once, read-only after (no lock needed).

#include "family.h"
#include "te/error.h"

namespace te::hf {

namespace detail {

namespace {

const std::vector<const Family*>& registered() {
  static const std::vector<const Family*> kFamilies = {
#define TE_HF_FAMILY(name) &name##_family(),
#include "list.h"
#undef TE_HF_FAMILY
  };
  return kFamilies;
}

}  // namespace

const Family* find_family(const std::string& model_type) {
  for (const Family* f : registered()) {
    if (f->info.model_type == model_type) return f;
  }
  return nullptr;
}

const Family& family_of(const CausalLMConfig& config, const std::string& where) {
  const Family* f = find_family(config.model_type);
  TE_CHECK(f != nullptr, where, ": model_type '", config.model_type,
           "' is not a causal LM family te-cpp loads (", causal_lm_family_names(), ")");
  return *f;
}

const Family* find_gguf_family(const std::string& architecture, bool experts) {
  if (architecture.empty()) return nullptr;
  for (const Family* f : registered()) {
    if (experts && f->gguf != nullptr && f->gguf_experts_of == architecture) return f;
  }
  for (const Family* f : registered()) {
    if (f->gguf != nullptr && f->info.gguf_architecture == architecture) return f;
  }
  return nullptr;
}


}  // namespace detail

const std::vector<FamilyInfo>& causal_lm_families() {
  static const std::vector<FamilyInfo> kInfo = [] {
    std::vector<FamilyInfo> out;
    for (const detail::Family* f : detail::registered()) out.push_back(f->info);
    return out;
  }();
  return kInfo;
}

std::string causal_lm_family_names(bool gguf) {
  std::string out;
  for (const FamilyInfo& f : causal_lm_families()) {
    const std::string& name = gguf ? f.gguf_architecture : f.model_type;
    if (name.empty()) continue;
    out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

std::string causal_lm_family_titles() {
  std::string out;
  for (const FamilyInfo& f : causal_lm_families()) out += (out.empty() ? "" : ", ") + f.title;
  return out;
}

}  // namespace te::hf
