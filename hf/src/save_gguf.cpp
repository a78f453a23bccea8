// te::hf::save_gguf (see save.h): a trained model as llama.cpp reads it. The inverse of
// gguf_model.cpp's reading: the family's llama.cpp names, query and key rows interleaved again
// (convert_hf_to_gguf.py LlamaModel.permute), norms stored plus one where the family's converter
// adds it; the source file's metadata (tokenizer, chat template, architecture keys) kept, its
// tensors that are not weights (RoPE frequency factors) copied.

#include <ATen/ATen.h>

#include <set>
#include <utility>

#include "families/family.h"
#include "gguf_write.h"
#include "save_detail.h"
#include "source.h"
#include "te/error.h"
#include "te/hf/save.h"

namespace te::hf {

namespace {

// The llama.cpp name of a Hugging Face tensor in the family's names ("" when it has none), and
// for an expert's tensor its entry in the stacked one (else -1).
std::pair<std::string, int64_t> to_gguf(const detail::GgufNames& names, const std::string& hf) {
  for (const auto& [h, g] : names.global) {
    if (hf == h) return {g, -1};
  }
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return {"", -1};
  const std::size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos) return {"", -1};
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  const std::string rest = hf.substr(dot + 1);
  for (const auto& [h, g] : names.layer) {
    if (rest == h) return {"blk." + layer + "." + g, -1};
  }
  for (const detail::GgufExperts& e : names.experts) {  // prefix, the expert's number, suffix
    if (rest.size() <= e.prefix.size() + e.suffix.size() || rest.rfind(e.prefix, 0) != 0 ||
        rest.compare(rest.size() - e.suffix.size(), e.suffix.size(), e.suffix) != 0) {
      continue;
    }
    const std::string n =
        rest.substr(e.prefix.size(), rest.size() - e.prefix.size() - e.suffix.size());
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    return {"blk." + layer + "." + e.gguf, std::stoll(n)};
  }
  return {"", -1};
}

GgmlType type_of(const std::string& name) {
  if (name == "f32") return GgmlType::kF32;
  if (name == "f16") return GgmlType::kF16;
  if (name == "bf16") return GgmlType::kBF16;
  if (name == "q8_0") return GgmlType::kQ8_0;
  TE_FAIL("save_gguf: type '", name, "' is not f32, f16, bf16 or q8_0");
}

// llama.cpp's general.file_type (LLAMA_FTYPE_ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16).
int64_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

// A weight as llama.cpp's converter stores it, from its Hugging Face form.
at::Tensor to_llama_cpp(at::Tensor w, const std::string& g, const detail::Family& family,
                        const CausalLMConfig& c) {
  w = w.to(at::kFloat);
  const bool q = g.find(".attn_q.") != std::string::npos;
  const bool k = g.find(".attn_k.") != std::string::npos;
  if (family.gguf_interleaved_qk && (q || k)) {
    // Hugging Face's row h*d + j*d/2 + i is llama.cpp's h*d + 2i + j.
    const int64_t heads = q ? c.num_attention_heads : c.num_key_value_heads;
    const int64_t d = w.size(0) / heads;
    std::vector<int64_t> split = {heads, 2, d / 2};
    for (int64_t i = 1; i < w.dim(); ++i) split.push_back(w.size(i));
    w = w.reshape(split).transpose(1, 2).reshape(w.sizes());
  }
  if (family.gguf_norms_plus_one && g.size() >= 11 &&
      g.compare(g.size() - 11, 11, "norm.weight") == 0) {
    w = w + 1;
  }
  return w.contiguous();
}

// The tensors of the new file, in the source file's order.
std::vector<detail::GgufOutTensor> gguf_tensors(const CausalLMImpl& model,
                                                const std::string& source,
                                                const detail::Family& family, GgmlType type) {
  std::map<std::string, at::Tensor> by_gguf;
  std::map<std::string, std::map<int64_t, at::Tensor>> experts;  // stacked at the end
  for (auto& [hf, w] : to_hf_tensors(detail::gguf_file_weight_map(family, model.config),
                                     detail::whole_parameters(model, "save_gguf"))) {
    const auto [g, expert] = to_gguf(*family.gguf, hf);
    TE_CHECK(!g.empty(), "save_gguf: '", hf, "' has no llama.cpp name in the ",
             family.info.model_type, " family");
    if (expert >= 0) {
      experts[g][expert] = w.to(at::kFloat);
    } else {
      by_gguf[g] = to_llama_cpp(w, g, family, model.config);
    }
  }
  for (auto& [g, by_expert] : experts) {
    std::vector<at::Tensor> stack;
    for (auto& [e, w] : by_expert) {
      TE_CHECK(e == static_cast<int64_t>(stack.size()), "internal: save_gguf: '", g,
               "' lacks expert ", stack.size());
      stack.push_back(w);
    }
    by_gguf[g] = at::stack(stack).contiguous();
  }
  GgufFile file(source);
  std::vector<detail::GgufOutTensor> out;
  std::set<std::string> written;
  for (const GgufTensor& t : file.header().tensors) {
    const auto it = by_gguf.find(t.name);
    detail::GgufOutTensor o;
    o.name = t.name;
    if (it == by_gguf.end()) {  // not a weight (RoPE factors): as the source holds it
      std::vector<int64_t> lo(t.shape.size(), 0);
      o.values = file.read(t.name, lo, t.shape);
    } else {
      // As the source holds it: a row [1, n] (Qwen2-MoE's shared expert gate) may be [n] there.
      const bool one_row = it->second.dim() == 2 && it->second.size(0) == 1 &&
                           t.shape == std::vector<int64_t>{it->second.size(1)};
      o.values = one_row ? it->second.reshape(t.shape) : it->second;
      TE_CHECK(o.values.sizes().vec() == t.shape, "save_gguf: the model's '", t.name, "' is ",
               o.values.sizes(), " but '", source, "' holds ", at::IntArrayRef(t.shape),
               "; export a model loaded from that file");
      written.insert(t.name);
    }
    // 1-D tensors, single rows, biases and the routers stay float32 (llama.cpp's converter keeps
    // norms and whatever does not end in .weight so, gpt-oss's experts' biases [E, F] among them,
    // and forces FFN_GATE_INP and FFN_GATE_INP_SHEXP to F32; llama-quantize leaves
    // ffn_gate_inp.weight), rows that are not whole Q8_0 blocks go F16.
    const bool router = t.name.find(".ffn_gate_inp") != std::string::npos;  // _shexp's too
    const bool weight = t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
    o.type =
        o.values.dim() < 2 || o.values.size(0) == 1 || router || !weight ? GgmlType::kF32 : type;
    if (o.type == GgmlType::kQ8_0 && o.values.size(-1) % 32 != 0) o.type = GgmlType::kF16;
    out.push_back(std::move(o));
  }
  for (const auto& [g, w] : by_gguf) {
    TE_CHECK(written.count(g), "save_gguf: the model's '", g, "' is not in '", source,
             "'; export a model loaded from that file");
  }
  return out;
}

}  // namespace

void save_gguf(const CausalLMImpl& model, const std::string& source_gguf, const std::string& path,
               const std::string& type) {
  const GgmlType t = type_of(type);
  const GgufHeader header = read_gguf_header(source_gguf);
  const std::string arch = header.string("general.architecture").value_or("");
  const detail::Family* family = detail::find_gguf_family(header);
  TE_CHECK(family != nullptr && family->gguf != nullptr, "save_gguf: '", source_gguf,
           "': general.architecture '", arch, "' is not one te-cpp writes");
  detail::check_same_sizes(detail::open_gguf_causal_lm(source_gguf).config, model.config,
                           "save_gguf: '" + source_gguf + "'");
  std::vector<detail::GgufOutTensor> tensors = gguf_tensors(model, source_gguf, *family, t);
  std::map<std::string, GgufValue> metadata;
  for (const auto& [key, v] : header.metadata) {
    if (key.rfind("quantize.", 0) != 0) metadata[key] = v;  // the source's quantization, gone
  }
  GgufValue ftype;
  ftype.type = 4;  // u32
  ftype.integer = file_type(t);
  metadata["general.file_type"] = ftype;
  detail::on_rank_zero([&] { detail::write_gguf(path, metadata, tensors); });
}

}  // namespace te::hf
