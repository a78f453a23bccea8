// A GGUF file as a Hugging Face checkpoint: its family from general.architecture (the registry,
// families/), its config from the metadata (llama.cpp's keys, transformers 5.23.0's
// integrations/ggml.py GGUF_CONFIG_MAPPING), its tensors under the family's Hugging Face names,
// query and key rows the converter interleaved put back in Hugging Face's order
// (modeling_gguf_pytorch_utils.py LlamaTensorProcessor._reverse_permute_weights, undoing
// llama.cpp's convert_hf_to_gguf.py LlamaModel.permute), norms stored plus one taken back
// (Gemma2TensorProcessor); tests/interop/check_hf_models.py loads the same file with transformers.

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "families/family.h"
#include "families/rope_scaling.h"
#include "source.h"
#include "te/error.h"
#include "te/hf/gguf.h"

namespace te::hf::detail {

namespace {

// llama.cpp's RoPE frequency factors tensors: Llama 3's, and LongRoPE's two sets (Phi-3).
constexpr const char* kRopeFreqs = "rope_freqs.weight";
constexpr const char* kRopeShort = "rope_factors_short.weight";
constexpr const char* kRopeLong = "rope_factors_long.weight";

// A llama.cpp tensor's layer and the rest of its name ("blk.3.attn_q.weight": "3",
// "attn_q.weight"); nullopt for a tensor outside the layers.
std::optional<std::pair<std::string, std::string>> layer_part(const std::string& gguf) {
  if (gguf.rfind("blk.", 0) != 0) return std::nullopt;
  const std::size_t dot = gguf.find('.', 4);
  if (dot == std::string::npos) return std::nullopt;
  return std::make_pair(gguf.substr(4, dot - 4), gguf.substr(dot + 1));
}

// The Hugging Face name of a llama.cpp tensor in the family's names ("" when it has none).
std::string to_hf(const GgufNames& names, const std::string& gguf) {
  for (const auto& [h, g] : names.global) {
    if (gguf == g) return h;
  }
  const auto part = layer_part(gguf);
  if (!part) return "";
  for (const auto& [h, g] : names.layer) {
    if (part->second == g) return "model.layers." + part->first + "." + h;
  }
  return "";
}

// The experts' entry of a llama.cpp tensor, nullptr when it is not one.
const GgufExperts* experts_of(const GgufNames& names, const std::string& gguf) {
  const auto part = layer_part(gguf);
  if (!part) return nullptr;
  for (const GgufExperts& e : names.experts) {
    if (part->second == e.gguf) return &e;
  }
  return nullptr;
}

class GgufSource : public TensorSource {
 public:
  GgufSource(GgufFile file, const CausalLMConfig& config, const Family& family)
      : file_(std::move(file)) {
    permute_ = family.gguf_interleaved_qk;
    norms_plus_one_ = family.gguf_norms_plus_one;
    heads_ = config.num_attention_heads;
    kv_heads_ = config.num_key_value_heads;
    for (const GgufTensor& t : file_.header().tensors) {
      // llama.cpp's RoPE frequency factors are the config's (gguf_config), not weights.
      if (t.name == kRopeFreqs || t.name == kRopeShort || t.name == kRopeLong) continue;
      if (const GgufExperts* e = experts_of(*family.gguf, t.name)) {
        const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
        TE_CHECK(t.shape.size() == (bias ? 2u : 3u), "gguf: '", t.name, "' in '", file_.path(),
                 "' is ", at::IntArrayRef(t.shape), "; the experts' ",
                 bias ? "bias is [experts, cols]" : "tensor is [experts, rows, cols]");
        const std::string layer = "model.layers." + layer_part(t.name)->first + ".";
        for (int64_t x = 0; x < t.shape[0]; ++x) {
          add(layer + e->prefix + std::to_string(x) + e->suffix, {t.name, x});
        }
        continue;
      }
      const std::string hf = to_hf(*family.gguf, t.name);
      const auto part = layer_part(t.name);
      const std::string layer = part ? "model.layers." + part->first + "." : "";
      const bool one_row = part && !hf.empty() && t.shape.size() == 1 &&
                           family.gguf->one_row.count(hf.substr(layer.size()));
      add(hf.empty() ? t.name : hf, {t.name, -1, one_row});  // no counterpart: stays itself
    }
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [hf, g] : names_) out.push_back(hf);
    return out;
  }
  bool contains(const std::string& name) const override { return names_.count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) override {
    const Entry& e = names_.at(name);
    std::vector<int64_t> s = file_.tensor(e.gguf)->shape;
    if (e.expert >= 0) s.erase(s.begin());
    if (e.one_row) s.insert(s.begin(), 1);
    return s;
  }
  at::ScalarType dtype(const std::string&) override { return at::kFloat; }  // dequantized
  at::Tensor read(const std::string& name, const std::vector<int64_t>& lo,
                  const std::vector<int64_t>& hi, int64_t* bytes_read) override {
    const Entry& e = names_.at(name);
    if (e.expert >= 0 || e.one_row) {
      // An expert's [rows, cols] within [experts, rows, cols]; or [1, n] of a tensor [n].
      std::vector<int64_t> l = lo, h = hi;
      if (e.one_row) {  // the box of [1, n]: its dim 0 is the one row
        l.erase(l.begin());
        h.erase(h.begin());
      } else {
        l.insert(l.begin(), e.expert);
        h.insert(h.begin(), e.expert + 1);
      }
      const at::Tensor t = file_.read(e.gguf, l, h, bytes_read);
      return e.one_row ? t.unsqueeze(0) : t.squeeze(0);
    }
    const std::string& g = e.gguf;
    const bool q = g.find(".attn_q.") != std::string::npos;
    const bool k = g.find(".attn_k.") != std::string::npos;
    if (norms_plus_one_ && g.size() >= 11 && g.compare(g.size() - 11, 11, "norm.weight") == 0) {
      return file_.read(g, lo, hi, bytes_read) - 1;  // the converter's + 1 (Gemma2Model)
    }
    if (!permute_ || !(q || k)) return file_.read(g, lo, hi, bytes_read);
    // llama.cpp stores each head's rows as pairs (2i, 2i+1) where Hugging Face has halves
    // (i, i + d/2): read the whole heads holding the box's rows, and reorder within each.
    const int64_t rows = file_.tensor(g)->shape[0];
    const int64_t heads = q ? heads_ : kv_heads_, d = rows / heads;
    TE_CHECK(rows % heads == 0 && d % 2 == 0, "gguf: ", where(name), " has ", rows,
             " rows, not whole heads of an even size for ", heads, " heads");
    const int64_t h0 = lo[0] / d, h1 = (hi[0] + d - 1) / d;
    std::vector<int64_t> wlo = lo, whi = hi;
    wlo[0] = h0 * d;
    whi[0] = h1 * d;
    at::Tensor w = file_.read(g, wlo, whi, bytes_read);
    std::vector<int64_t> split = {h1 - h0, d / 2, 2};
    for (std::size_t i = 1; i < lo.size(); ++i) split.push_back(hi[i] - lo[i]);
    w = w.view(split).transpose(1, 2).reshape(at::IntArrayRef(w.sizes()));
    return w.narrow(0, lo[0] - wlo[0], hi[0] - lo[0]).contiguous();
  }
  std::string where(const std::string& name) const override {
    const Entry& e = names_.at(name);
    return "'" + e.gguf + "'" +
           (e.expert >= 0 ? " (expert " + std::to_string(e.expert) + ")" : "") + " in '" +
           file_.path() + "'";
  }
  std::shared_ptr<const nn::BlockMatrix> blocks(const std::string& name) override {
    const Entry& e = names_.at(name);
    if (e.one_row) return nullptr;
    const std::string& g = e.gguf;
    const GgufTensor* t = file_.tensor(g);
    const std::size_t dims = e.expert >= 0 ? 3 : 2;  // an expert's rows of [experts, rows, cols]
    if (t->shape.size() != dims || !ggml::is_quantized(t->type)) return nullptr;
    auto m = std::make_shared<nn::BlockMatrix>();
    m->type = t->type;
    m->rows = t->shape[dims - 2];
    m->cols = t->shape[dims - 1];
    const std::shared_ptr<const unsigned char> map = file_.mapped();
    m->owner = map;
    const ggml::BlockShape b = ggml::block_shape(t->type, where(name));
    const int64_t row_bytes = m->cols / b.elements * b.bytes;
    const unsigned char* base =
        map.get() + t->offset + std::max<int64_t>(e.expert, 0) * m->rows * row_bytes;
    m->row_data.resize(static_cast<std::size_t>(m->rows));
    for (int64_t r = 0; r < m->rows; ++r) m->row_data[r] = base + r * row_bytes;
    const bool q = g.find(".attn_q.") != std::string::npos;
    const bool k = g.find(".attn_k.") != std::string::npos;
    if (permute_ && (q || k)) {
      // As read() reorders them: Hugging Face's row h * d + j * d / 2 + i is llama.cpp's
      // h * d + 2 * i + j. Only the pointers move.
      const int64_t heads = q ? heads_ : kv_heads_, d = m->rows / heads;
      TE_CHECK(m->rows % heads == 0 && d % 2 == 0, "gguf: ", where(name), " has ", m->rows,
               " rows, not whole heads of an even size for ", heads, " heads");
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < 2; ++j) {
          for (int64_t i = 0; i < d / 2; ++i) {
            m->row_data[h * d + j * (d / 2) + i] = base + (h * d + 2 * i + j) * row_bytes;
          }
        }
      }
    }
    return m;
  }

 private:
  // A Hugging Face tensor in the file: llama.cpp's tensor, the expert's entry of it (or -1),
  // whether it is [1, n] held as [n].
  struct Entry {
    std::string gguf;
    int64_t expert = -1;
    bool one_row = false;
  };
  void add(const std::string& hf, const Entry& e) {
    const auto [it, added] = names_.emplace(hf, e);
    TE_CHECK(added, "gguf: '", file_.path(), "' has both '", it->second.gguf, "' and '", e.gguf,
             "', which are the same tensor ('", hf, "')");
  }
  GgufFile file_;
  std::map<std::string, Entry> names_;  // Hugging Face name -> where in the file
  bool permute_ = false, norms_plus_one_ = false;
  int64_t heads_ = 0, kv_heads_ = 0;
};

}  // namespace

// Here, not in registry.cpp, which reads no GGUF (the config fuzzer builds it alone).
const Family* find_gguf_family(const GgufHeader& header) {
  const std::string arch = header.string("general.architecture").value_or("");
  // llama.cpp's own saver writes expert_count 0 into dense files.
  return find_gguf_family(arch, header.integer(arch + ".expert_count").value_or(0) > 0);
}

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

namespace {

// The metadata keys of one architecture ("llama." ...), each read one remembered: a key of the
// architecture that was never read is refused (refuse_unread).
struct ArchKeys : GgufKeys {
  ArchKeys(const GgufFile& f, const std::string& architecture)
      : file(f), arch(architecture), a(architecture + ".") {}
  const GgufFile& file;
  std::string arch, a;
  std::set<std::string> read;

  std::optional<int64_t> integer(const std::string& key) override {
    read.insert(a + key);
    return file.integer(a + key);
  }
  std::optional<double> number(const std::string& key) override {
    read.insert(a + key);
    return file.number(a + key);
  }
  [[noreturn]] void fail(const std::string& key, const std::string& message) const override {
    TE_FAIL("gguf: '", file.path(), "': ", a + key, ": ", message);
  }
  std::optional<std::string> string(const std::string& key) {
    read.insert(a + key);
    return file.string(a + key);
  }
  int64_t required(const std::string& key) {
    const auto v = integer(key);
    TE_CHECK(v && *v > 0, "gguf: '", file.path(), "': metadata '", a + key,
             "' is missing or not positive; a ", arch, " model needs it");
    return *v;
  }
  // Every key of the architecture is honoured or refused; general.* and tokenizer.* are metadata
  // and the vocabulary.
  void refuse_unread() const {
    for (const auto& [key, value] : file.header().metadata) {
      if (key.rfind("general.", 0) == 0 || key.rfind("tokenizer.", 0) == 0 || read.count(key)) {
        continue;
      }
      TE_FAIL("gguf: '", file.path(), "': metadata '", key,
              "' is not a key te-cpp honours; te-cpp builds the model from every key it reads "
              "and will not ignore one that may change it");
    }
  }
};

// The sizes: hidden, layers, MLP, heads and their dims, context.
void read_sizes(ArchKeys& k, CausalLMConfig& c) {
  const std::string& path = k.file.path();
  const std::string& a = k.a;
  c.hidden_size = k.required("embedding_length");
  c.num_hidden_layers = k.required("block_count");
  TE_CHECK(c.num_hidden_layers <= 65536, "gguf: '", path, "': ", a, "block_count ",
           c.num_hidden_layers, " is more than te-cpp builds (at most 65536)");
  c.intermediate_size = k.required("feed_forward_length");
  c.num_attention_heads = k.required("attention.head_count");
  c.num_key_value_heads = k.integer("attention.head_count_kv").value_or(c.num_attention_heads);
  c.head_dim = k.integer("attention.key_length").value_or(0);
  if (c.head_dim == 0) {
    TE_CHECK(c.hidden_size % c.num_attention_heads == 0, "gguf: '", path, "': ", a,
             "embedding_length is not a multiple of the heads and there is no key_length");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  const int64_t value_length = k.integer("attention.value_length").value_or(c.head_dim);
  TE_CHECK(value_length == c.head_dim, "gguf: '", path, "': ", a, "attention.value_length ",
           value_length, " differs from the key length ", c.head_dim, "; te-cpp needs them equal");
  c.max_position_embeddings = k.integer("context_length").value_or(0);
}

// The norm's epsilon and RoPE (base, rotary dims, linear or YaRN scaling).
void read_rope(ArchKeys& k, CausalLMConfig& c) {
  const std::string& path = k.file.path();
  c.rms_norm_eps = k.number("attention.layer_norm_rms_epsilon").value_or(1e-6);
  c.rope_theta = k.number("rope.freq_base").value_or(10000.0);
  c.rotary_dim = k.integer("rope.dimension_count").value_or(c.head_dim);
  const auto type = k.string("rope.scaling.type");
  if (!type || *type == "none") return;
  if (*type == "yarn") return read_gguf_yarn(k, path, c);
  TE_CHECK(*type == "linear", "gguf: '", path, "': ", k.a, "rope.scaling.type '", *type,
           "' is not supported by te-cpp (none, linear, yarn)");
  c.rope_type = "linear";
  c.rope_factor = k.number("rope.scaling.factor").value_or(0.0);
  TE_CHECK(c.rope_factor > 0, "gguf: '", path, "': linear RoPE scaling needs ", k.a,
           "rope.scaling.factor");
}

// What the tensors say: the vocabulary (checked against the metadata), tied embeddings, biases
// and the q/k norms.
void read_tensors(ArchKeys& k, CausalLMConfig& c) {
  const GgufFile& file = k.file;
  const std::string& path = file.path();
  const GgufTensor* embed = file.tensor("token_embd.weight");
  TE_CHECK(embed != nullptr && embed->shape.size() == 2, "gguf: '", path,
           "' has no 2-dim token_embd.weight");
  c.vocab_size = k.integer("vocab_size").value_or(embed->shape[0]);
  TE_CHECK(embed->shape[0] == c.vocab_size && embed->shape[1] == c.hidden_size, "gguf: '", path,
           "': token_embd.weight is ", at::IntArrayRef(embed->shape), " but the metadata says ",
           k.a, "vocab_size ", c.vocab_size, " and ", k.a, "embedding_length ", c.hidden_size);
  c.tie_word_embeddings = file.tensor("output.weight") == nullptr;
  c.qkv_bias = file.tensor("blk.0.attn_q.bias") != nullptr;
  c.attention_bias = file.tensor("blk.0.attn_output.bias") != nullptr;
  c.mlp_bias = file.tensor("blk.0.ffn_down.bias") != nullptr;
  c.qk_norm = file.tensor("blk.0.attn_q_norm.weight") != nullptr;
}

// One of llama.cpp's RoPE factor tensors (empty when the file has none): one factor per rotary
// pair, dividing its inverse frequency.
std::vector<double> rope_factors(GgufFile& file, const CausalLMConfig& c, const char* name) {
  const GgufTensor* t = file.tensor(name);
  if (t == nullptr) return {};
  const int64_t pairs = (c.rotary_dim == 0 ? c.head_dim : c.rotary_dim) / 2;
  TE_CHECK(t->shape.size() == 1 && t->shape[0] == pairs, "gguf: '", file.path(), "': ", name,
           " is ", at::IntArrayRef(t->shape), "; the ", pairs, " rotary pairs need [", pairs, "]");
  const at::Tensor f = file.read(name, {0}, {pairs}).to(at::kDouble).contiguous();
  return {f.data_ptr<double>(), f.data_ptr<double>() + pairs};
}

// llama.cpp's RoPE frequency factors: Llama 3's scaling as rope_freqs.weight (convert_hf_to_gguf.py
// LlamaModel.generate_extra_tensors), or LongRoPE's short and long sets with the attention factor
// and the original length (Phi3MiniModel.generate_extra_tensors and set_gguf_parameters, which
// always write that length: read past without the long set).
void read_rope_freqs(GgufFile& file, ArchKeys& k, CausalLMConfig& c) {
  if (std::vector<double> freqs = rope_factors(file, c, kRopeFreqs); !freqs.empty()) {
    TE_CHECK(c.rope_type != "yarn", "gguf: '", file.path(), "': ", kRopeFreqs, " beside ", k.a,
             "rope.scaling.type 'yarn' is not a RoPE te-cpp builds");
    c.rope_freq_factors = std::move(freqs);
  }
  const auto original = k.integer("rope.scaling.original_context_length");
  const auto attn_factor = k.number("rope.scaling.attn_factor");
  std::vector<double> long_set = rope_factors(file, c, kRopeLong);
  if (long_set.empty()) {
    TE_CHECK(!attn_factor, "gguf: '", file.path(), "': ", k.a,
             "rope.scaling.attn_factor without LongRoPE's ", kRopeLong,
             " is not a RoPE te-cpp builds");
    return;
  }
  TE_CHECK(c.rope_freq_factors.empty() && c.rope_type == "default", "gguf: '", file.path(),
           "': ", kRopeLong, " beside other RoPE scaling (", kRopeFreqs, " or ", k.a,
           "rope.scaling.type) is not a RoPE te-cpp builds");
  TE_CHECK(file.tensor(kRopeShort) && original && *original > 0 && attn_factor, "gguf: '",
           file.path(), "': LongRoPE's ", kRopeLong, " needs ", kRopeShort, ", ", k.a,
           "rope.scaling.original_context_length and ", k.a, "rope.scaling.attn_factor");
  c.rope_type = "longrope";
  c.rope_freq_factors = rope_factors(file, c, kRopeShort);
  c.rope_long_freq_factors = std::move(long_set);
  c.rope_original_max_position_embeddings = *original;
  c.rope_attention_factor = *attn_factor;
}

// The config a GGUF file's metadata (llama.cpp's keys) and tensors describe.
CausalLMConfig gguf_config(GgufFile& file, const Family& family) {
  const std::string& path = file.path();
  const std::string arch = file.string("general.architecture").value_or("");
  ArchKeys keys(file, arch);
  CausalLMConfig c;
  c.model_type = family.info.model_type;
  read_sizes(keys, c);
  read_rope(keys, c);
  read_rope_freqs(file, keys, c);
  read_tensors(keys, c);
  // Phi-3's window: llama.cpp turns it off (src/models/phi3.cpp load_arch_hparams) and
  // transformers' GGUF_CONFIG_MAPPING["phi3"] does not map it, so both attend fully.
  if (family.gguf_ignores_sliding_window) keys.integer("attention.sliding_window");
  // transformers reads tokenizer.ggml.padding_token_id into the config's pad_token_id
  // (integrations/ggml.py, GGUF_CONFIG_MAPPING["tokenizer"]).
  c.pad_token_id = file.integer("tokenizer.ggml.padding_token_id");
  c.layer_windows.assign(static_cast<std::size_t>(c.num_hidden_layers), std::nullopt);
  if (family.read_gguf_config) family.read_gguf_config(keys, c);
  c.dtype = "gguf";
  keys.refuse_unread();
  check_causal_lm_config(c, "'" + path + "' (GGUF metadata)");
  return c;
}

}  // namespace

GgufModel open_gguf_causal_lm(const std::string& path) {
  GgufFile file(path);
  const std::string arch = file.string("general.architecture").value_or("");
  const Family* family = find_gguf_family(file.header());
  TE_CHECK(family != nullptr, "gguf: '", path, "': general.architecture '", arch,
           "' is not one te-cpp loads (", causal_lm_family_names(/*gguf=*/true), ")");
  GgufModel m;
  m.config = gguf_config(file, *family);
  m.source = std::make_unique<GgufSource>(std::move(file), m.config, *family);
  return m;
}

}  // namespace te::hf::detail
