// load_causal_lm: a Hugging Face checkpoint into te::hf::CausalLM, each rank reading only the
// byte ranges of its own slices (te::nn::SafetensorsReader), and the weight map both ways.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "families/family.h"
#include "source.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/hf/causal_lm.h"
#include "te/nn/embedding.h"
#include "te/nn/init.h"
#include "te/nn/moe_layer.h"
#include "te/nn/safetensors.h"
#include "te/nn/sharded.h"

namespace te::hf {

namespace fs = std::filesystem;

WeightMap causal_lm_weight_map(const CausalLMConfig& c) {
  return detail::family_of(c, "causal_lm_weight_map").weight_map(c);
}

namespace {

// The part of te tensor `t` (shape as the te parameter) that `s` describes, in the source's
// own layout.
at::Tensor source_part(const at::Tensor& t, const HfSource& s) {
  const at::Tensor entry = s.expert >= 0 ? t.select(0, s.expert) : t;
  at::Tensor part = s.slot_dim >= 0 ? entry.select(s.slot_dim, s.slot) : entry;
  return s.transpose ? part.t() : part;
}

// The source's shape given the te parameter's (the whole tensor's, when narrowed).
std::vector<int64_t> source_shape(std::vector<int64_t> shape, const HfSource& s) {
  if (s.expert >= 0) shape.erase(shape.begin());
  if (s.slot_dim >= 0) shape.erase(shape.begin() + s.slot_dim);
  if (s.transpose) std::reverse(shape.begin(), shape.end());
  if (s.narrow_dim >= 0) shape[static_cast<std::size_t>(s.narrow_dim)] = s.narrow_total;
  return shape;
}

// The end (exclusive) of `length` entries of a narrowed source from its narrow_start.
int64_t narrow_end(const HfSource& s, int64_t length) {
  return s.narrow_start + (length - 1) * s.narrow_step + 1;
}

// A Hugging Face directory: model.safetensors, or the files of a sharded set's index.
class SafetensorsSource : public detail::TensorSource {
 public:
  explicit SafetensorsSource(const fs::path& dir) {
    const fs::path index = dir / "model.safetensors.index.json";
    std::error_code ec;
    if (fs::exists(index, ec)) {
      std::ifstream in(index, std::ios::binary);
      TE_CHECK(in.good(), "load: cannot read '", index.string(), "'");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(
            std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
      } catch (const nlohmann::json::exception& e) {
        TE_FAIL("load: '", index.string(), "' is not JSON: ", e.what());
      }
      TE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), "load: '",
               index.string(), "' has no weight_map object");
      for (const auto& [name, file] : j["weight_map"].items()) {
        TE_CHECK(file.is_string() &&
                     fs::path(file.get<std::string>()).filename() == file.get<std::string>() &&
                     file != "." && file != "..",
                 "load: '", index.string(), "': weight_map[\"", name,
                 "\"] is not a file name in the directory: ", file.dump());
        files_[name] = (dir / file.get<std::string>()).string();
      }
      return;
    }
    const fs::path single = dir / "model.safetensors";
    TE_CHECK(fs::exists(single, ec), "load: '", dir.string(),
             "' holds neither model.safetensors nor model.safetensors.index.json");
    nn::SafetensorsReader& reader = reader_of(single.string());
    for (const std::string& name : reader.names()) files_[name] = single.string();
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, file] : files_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const override { return files_.count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) override {
    return reader_of(files_.at(name)).shape(name);
  }
  at::ScalarType dtype(const std::string& name) override {
    return nn::safetensors_scalar_type(reader_of(files_.at(name)).dtype(name), where(name));
  }
  at::Tensor read(const std::string& name, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, int64_t* bytes_read) override {
    return reader_of(files_.at(name)).read(name, lo, hi, {}, bytes_read);
  }
  std::string where(const std::string& name) const override {
    return "'" + name + "' in '" + files_.at(name) + "'";
  }

 private:
  nn::SafetensorsReader& reader_of(const std::string& file) {
    auto& r = readers_[file];
    if (!r) r = std::make_unique<nn::SafetensorsReader>(file);
    return *r;
  }
  std::map<std::string, std::string> files_;
  std::map<std::string, std::unique_ptr<nn::SafetensorsReader>> readers_;
};

}  // namespace

std::map<std::string, at::Tensor> to_hf_tensors(const WeightMap& map,
                                                const std::map<std::string, at::Tensor>& te_whole) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [te_name, sources] : map) {
    const auto it = te_whole.find(te_name);
    TE_CHECK(it != te_whole.end(), "to_hf_tensors: no tensor for '", te_name, "'");
    for (const HfSource& s : sources) {
      const at::Tensor part = source_part(it->second, s).contiguous();
      if (s.narrow_dim < 0) {
        out[s.name] = part;
        continue;
      }
      at::Tensor& whole = out[s.name];  // assembled from its narrowed parts
      if (!whole.defined()) {
        std::vector<int64_t> shape = part.sizes().vec();
        shape[static_cast<std::size_t>(s.narrow_dim)] = s.narrow_total;
        whole = at::zeros(shape, part.options());
      }
      whole.slice(s.narrow_dim, s.narrow_start, narrow_end(s, s.narrow_length), s.narrow_step)
          .copy_(part);
    }
  }
  return out;
}

std::map<std::string, at::Tensor> to_hf_tensors(const CausalLMConfig& config,
                                                const std::map<std::string, at::Tensor>& te_whole) {
  return to_hf_tensors(causal_lm_weight_map(config), te_whole);
}

namespace {

// A parameter's global shape and this rank's offsets into it.
struct Box {
  std::vector<int64_t> global, lo;
};
Box box_of(const std::string& name, const at::Tensor& local,
           const std::map<std::string, nn::ParameterLayout>& layouts) {
  Box b{local.sizes().vec(), std::vector<int64_t>(static_cast<std::size_t>(local.dim()), 0)};
  const auto layout = layouts.find(name);
  if (layout == layouts.end()) return b;
  b.global = layout->second.global_shape;
  if (layout->second.mesh) {
    const DeviceMesh& mesh = *layout->second.mesh;
    const auto chunks = local_chunks(b.global, mesh, layout->second.placements, mesh.rank());
    for (std::size_t d = 0; d < chunks.size(); ++d) b.lo[d] = chunks[d].offset;
  }
  return b;
}

}  // namespace

namespace detail {

std::unique_ptr<TensorSource> open_safetensors_dir(const std::string& dir) {
  return std::make_unique<SafetensorsSource>(dir);
}

void check_checkpoint(const CheckpointCheck& c, torch::nn::Module& shapes, TensorSource& source) {
  const auto layouts = nn::named_parameter_layouts(shapes);
  std::set<std::string> used;
  for (const auto& p : shapes.named_parameters(/*recurse=*/true)) {
    const auto sources = c.map.find(p.key());
    TE_CHECK(sources != c.map.end(), "internal: ", c.loader, ": no checkpoint tensor for te's '",
             p.key(), "'");
    const std::vector<int64_t> global = box_of(p.key(), p.value(), layouts).global;
    for (const HfSource& s : sources->second) {
      used.insert(s.name);
      TE_CHECK(source.contains(s.name), c.loader, ": the checkpoint at '", c.where, "' lacks '",
               s.name, "', which a ", c.family, " model of its config has");
      const std::vector<int64_t> want = source_shape(global, s);
      TE_CHECK(source.shape(s.name) == want, c.loader, ": ", source.where(s.name), " has shape ",
               at::IntArrayRef(source.shape(s.name)), " but ",
               c.gguf ? "its metadata implies " : "config.json implies ", at::IntArrayRef(want));
      TE_CHECK(at::isFloatingType(source.dtype(s.name)), c.loader, ": ", source.where(s.name),
               " is ", source.dtype(s.name), "; a weight must be a floating-point tensor");
    }
  }
  std::set<std::string> extra;
  for (const std::string& name : source.names()) {
    if (!used.count(name) && !(c.derived && c.derived(name))) extra.insert(name);
  }
  TE_CHECK(!c.strict || extra.empty(), c.loader, ": the checkpoint at '", c.where, "' holds '",
           extra.empty() ? "" : *extra.begin(), "'", extra.size() > 1 ? " (and " : "",
           extra.size() > 1 ? std::to_string(extra.size() - 1) + " more)" : "", ", which a ",
           c.family, " model of its config has no use for (load with strict = false to skip it)");
}

namespace {

// The blocks one te parameter of `shape` is made of, when every checkpoint tensor it takes is
// held in quantized blocks (of any types: each row keeps its own) and lies in it whole: a kernel
// [in, out] from one tensor [out, in] (or from consecutive rows of a fused one), or [in, S, out]
// from S of them stacked on dim 1 (their rows one after another); a table [rows, cols] from one
// tensor as it is. nullptr otherwise (the parameter is dequantized).
std::shared_ptr<const nn::BlockMatrix> blocks_of(const std::vector<HfSource>& sources_in,
                                                 const std::vector<int64_t>& shape, bool kernel,
                                                 TensorSource& source) {
  std::vector<HfSource> sources = sources_in;
  std::sort(sources.begin(), sources.end(),
            [](const HfSource& a, const HfSource& b) { return a.slot < b.slot; });
  const bool stacked = kernel && shape.size() == 3;
  if (shape.size() != (stacked ? 3u : 2u)) return nullptr;
  if (static_cast<int64_t>(sources.size()) != (stacked ? shape[1] : 1)) return nullptr;
  auto out = std::make_shared<nn::BlockMatrix>();
  std::vector<uint32_t> types;
  out->cols = kernel ? shape[0] : shape[1];
  const int64_t rows = kernel ? shape.back() : shape[0];
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const HfSource& s = sources[i];
    if (s.expert >= 0) return nullptr;  // experts' kernels are dequantized
    // A kernel may take some of a fused tensor's consecutive rows (Phi-3's qkv_proj,
    // gate_up_proj).
    const bool narrowed = s.narrow_dim >= 0;
    if (narrowed && s.narrow_step != 1) return nullptr;
    if (s.transpose != kernel || (narrowed && !(kernel && s.narrow_dim == 0)) ||
        s.slot_dim != (stacked ? 1 : -1) || (stacked && s.slot != static_cast<int64_t>(i))) {
      return nullptr;
    }
    const std::shared_ptr<const nn::BlockMatrix> m = source.blocks(s.name);
    if (m == nullptr || m->cols != out->cols || m->rows != (narrowed ? s.narrow_total : rows) ||
        (narrowed && s.narrow_length != rows) || !m->row_types.empty()) {
      return nullptr;
    }
    if (i == 0) out->type = m->type;
    out->owner = m->owner;
    const auto first = m->row_data.begin() + (narrowed ? s.narrow_start : 0);
    out->row_data.insert(out->row_data.end(), first, first + rows);
    types.insert(types.end(), rows, m->type);
  }
  out->rows = static_cast<int64_t>(out->row_data.size());
  // A stack of tensors of different types (a Q4_K_M file's Q4_K attn_k beside its Q6_K attn_v)
  // keeps each row's type.
  if (std::any_of(types.begin(), types.end(), [&](uint32_t t) { return t != out->type; })) {
    out->row_types = std::move(types);
  }
  return out;
}

// A mixture's stacked kernels [experts, in, out] or [experts, in, slots, out] held in blocks
// when each expert's entry is (blocks_of of its own tensors): the rows expert by expert
// (ShardedModule::HeldBlocks::experts). nullptr otherwise (the kernels are dequantized).
std::shared_ptr<const nn::BlockMatrix> expert_blocks_of(const std::vector<HfSource>& sources,
                                                        const std::vector<int64_t>& shape,
                                                        TensorSource& source) {
  if (shape.size() < 3) return nullptr;
  const std::vector<int64_t> entry(shape.begin() + 1, shape.end());
  auto out = std::make_shared<nn::BlockMatrix>();
  std::vector<uint32_t> types;
  std::size_t used = 0;
  for (int64_t e = 0; e < shape[0]; ++e) {
    std::vector<HfSource> mine;
    for (HfSource s : sources) {
      if (s.expert != e) continue;
      s.expert = -1;  // as a kernel of its own
      mine.push_back(s);
    }
    used += mine.size();
    const std::shared_ptr<const nn::BlockMatrix> m = blocks_of(mine, entry, true, source);
    if (m == nullptr) return nullptr;
    if (e == 0) {
      out->type = m->type;
      out->cols = m->cols;
    }
    out->owner = m->owner;
    out->row_data.insert(out->row_data.end(), m->row_data.begin(), m->row_data.end());
    for (int64_t r = 0; r < m->rows; ++r) types.push_back(m->type_of(r));
  }
  if (used != sources.size()) return nullptr;  // a source of no expert entry
  out->rows = static_cast<int64_t>(out->row_data.size());
  if (std::any_of(types.begin(), types.end(), [&](uint32_t t) { return t != out->type; })) {
    out->row_types = std::move(types);
  }
  return out;
}

}  // namespace

int64_t hold_blocks(torch::nn::Module& model, const WeightMap& map, TensorSource& source) {
  int64_t bytes = 0;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    auto* sharded = dynamic_cast<nn::ShardedModule*>(item.value().get());
    if (sharded == nullptr) continue;
    struct Candidate {
      std::string name;
      at::Tensor parameter;
      bool kernel;
    };
    std::vector<Candidate> candidates;
    for (const nn::ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      candidates.push_back({g.kernel_name, g.kernel, true});
    }
    if (auto* e = dynamic_cast<nn::EmbeddingImpl*>(item.value().get())) {
      candidates.push_back({"embedding", e->embedding, false});
    }
    int64_t experts = 0;  // a mixture's: its experts' and shared expert's kernels
    if (auto* moe = dynamic_cast<nn::LayerNormMoEImpl*>(item.value().get())) {
      experts = moe->options.num_experts();
      candidates.push_back({"wi_kernel", moe->wi_kernel, true});
      candidates.push_back({"wo_kernel", moe->wo_kernel, true});
      candidates.push_back({"shared_wi_kernel", moe->shared_wi_kernel, true});
      candidates.push_back({"shared_wo_kernel", moe->shared_wo_kernel, true});
    }
    for (const Candidate& c : candidates) {
      const std::string full = item.key().empty() ? c.name : item.key() + "." + c.name;
      const auto sources = map.find(full);
      if (sources == map.end() || !c.parameter.defined()) continue;
      const bool stacked = experts > 0 && (c.name == "wi_kernel" || c.name == "wo_kernel");
      const auto m = stacked
                         ? expert_blocks_of(sources->second, c.parameter.sizes().vec(), source)
                         : blocks_of(sources->second, c.parameter.sizes().vec(), c.kernel, source);
      if (m == nullptr) continue;
      sharded->hold_blocks(*item.value(), c.name, {m, {}, c.kernel, stacked ? experts : 0});
      bytes += m->bytes();
    }
  }
  return bytes;
}

int64_t fill(torch::nn::Module& model, const WeightMap& map, TensorSource& source) {
  const auto layouts = nn::named_parameter_layouts(model);
  int64_t bytes_read = 0;
  torch::NoGradGuard no_grad;
  for (auto& p : model.named_parameters(/*recurse=*/true)) {
    at::Tensor& local = p.value();
    const Box box = box_of(p.key(), local, layouts);
    for (const HfSource& s : map.at(p.key())) {
      // The slot's part of this rank's box, in the source's coordinates.
      HfSource part = s;
      std::vector<int64_t> lo = box.lo;
      if (s.expert >= 0) {  // another rank's expert under expert parallelism
        part.expert = s.expert - lo[0];
        if (part.expert < 0 || part.expert >= local.size(0)) continue;
        lo.erase(lo.begin());
      }
      if (s.slot_dim >= 0) {
        part.slot = s.slot - lo[static_cast<std::size_t>(s.slot_dim)];
        const int64_t slots = local.size(s.slot_dim + (s.expert >= 0 ? 1 : 0));
        if (part.slot < 0 || part.slot >= slots) continue;  // another rank's
      }
      at::Tensor dst = source_part(local, part);
      if (s.slot_dim >= 0) lo.erase(lo.begin() + s.slot_dim);
      if (s.transpose) std::reverse(lo.begin(), lo.end());
      if (dst.numel() == 0) continue;
      std::vector<int64_t> hi = lo;
      for (std::size_t d = 0; d < hi.size(); ++d) hi[d] += dst.size(static_cast<int64_t>(d));
      if (s.narrow_dim >= 0) {
        // The box's entries of the narrowed dim, narrow_step apart in the source: the span that
        // holds them, of which every narrow_step-th is taken.
        const auto d = static_cast<std::size_t>(s.narrow_dim);
        part.narrow_start = s.narrow_start + lo[d] * s.narrow_step;
        lo[d] = part.narrow_start;
        hi[d] = narrow_end(part, dst.size(s.narrow_dim));
      }
      at::Tensor got = source.read(s.name, lo, hi, &bytes_read);
      if (s.narrow_step != 1)
        got = got.slice(s.narrow_dim, 0, got.size(s.narrow_dim), s.narrow_step);
      dst.copy_(got);
    }
  }
  return bytes_read;
}

}  // namespace detail

CausalLM load_causal_lm(const std::string& path_text, const LoadOptions& options) {
  const fs::path path = fs::absolute(path_text);
  const bool gguf = detail::is_gguf(path.string());
  CausalLMConfig config;
  std::unique_ptr<detail::TensorSource> source;
  if (gguf) {
    detail::GgufModel m = detail::open_gguf_causal_lm(path.string());
    config = std::move(m.config);
    source = std::move(m.source);
  } else {
    config = read_causal_lm_config(path.string());
    source = detail::open_safetensors_dir(path.string());
  }
  config.packed_sequences = options.packed_sequences;
  config.cp_comm_type = options.cp_comm_type;
  config.cp_load_balanced = options.cp_load_balanced && cp_load_balance_is_exact(config);
  const detail::Family& family =
      detail::family_of(config, "load_causal_lm: '" + path.string() + "'");
  WeightMap map = gguf ? detail::gguf_file_weight_map(family, config) : family.weight_map(config);
  // A checkpoint saved from the family's base model (GPT2Model: openai-community/gpt2's own)
  // names its tensors without the LM head class's prefix.
  std::string prefix = family.base_prefix;
  if (!prefix.empty() && !source->contains(map.at("embed.embedding").front().name) &&
      source->contains(map.at("embed.embedding").front().name.substr(prefix.size()))) {
    for (auto& [te_name, sources] : map) {
      for (HfSource& s : sources) {
        if (s.name.rfind(prefix, 0) == 0) s.name = s.name.substr(prefix.size());
      }
    }
    prefix.clear();
  }
  // A tied head saved anyway is not a weight, nor are the buffers the family saves with them.
  const bool tied = config.tie_word_embeddings;
  return detail::load_into<CausalLM>(
      config,
      {map, "load_causal_lm", path.string(), config.model_type, gguf, options.strict,
       [tied, prefix, derived = family.derived](const std::string& name) {
         return (tied && name == "lm_head.weight") || derived(name, prefix);
       }},
      *source, options);
}

}  // namespace te::hf
