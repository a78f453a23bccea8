// te::hf::Encoder (BERT and MiniLM): its config, the model, the poolings, the weight map and
// load_encoder. transformers' BertModel (models/bert/modeling_bert.py, transformers 5.23.0) is the
// reference: tests/interop/check_hf_models.py and check_minilm.py hold this file to it.

#include "te/hf/encoder.h"

#include <ATen/ATen.h>

#include <cmath>
#include <filesystem>

#include "json_fields.h"
#include "source.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"
#include "te/nn/random.h"

namespace te::hf {

namespace nn = te::nn;
namespace F = te::nn::functional;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// config.json

void check_encoder_config(const EncoderConfig& c, const std::string& where) {
  auto fail = [&](const std::string& field, const std::string& message) {
    TE_FAIL("config: ", where, ": ", field, ": ", message);
  };
  detail::check_model_sizes({{"vocab_size", c.vocab_size},
                             {"hidden_size", c.hidden_size},
                             {"intermediate_size", c.intermediate_size},
                             {"num_hidden_layers", c.num_hidden_layers},
                             {"num_attention_heads", c.num_attention_heads},
                             {"max_position_embeddings", c.max_position_embeddings},
                             {"type_vocab_size", c.type_vocab_size}},
                            c.num_hidden_layers, where);
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail("num_attention_heads", std::to_string(c.num_attention_heads) +
                                    " does not divide hidden_size " +
                                    std::to_string(c.hidden_size));
  }
  if (c.pad_token_id && (*c.pad_token_id < 0 || *c.pad_token_id >= c.vocab_size)) {
    fail("pad_token_id", std::to_string(*c.pad_token_id) + " is not a row of the " +
                             std::to_string(c.vocab_size) + "-token vocabulary");
  }
  if (!(std::isfinite(c.layer_norm_eps) && c.layer_norm_eps > 0)) {
    fail("layer_norm_eps", "must be positive and finite");
  }
  if (!(c.hidden_dropout >= 0 && c.hidden_dropout < 1)) {
    fail("hidden_dropout_prob", "must be in [0, 1)");
  }
  if (!(c.attention_dropout >= 0 && c.attention_dropout < 1)) {
    fail("attention_probs_dropout_prob", "must be in [0, 1)");
  }
}

EncoderConfig parse_encoder_config(std::string_view json_text, const std::string& path) {
  const nlohmann::json j = detail::parse_json_object(json_text, path);
  detail::Fields f(j, path, "");
  EncoderConfig c;
  c.model_type = f.string_or("model_type", "");
  if (c.model_type != "bert") {
    f.fail("model_type", "'" + c.model_type +
                             "' is not an encoder family te-cpp loads (bert; the llama family "
                             "loads with te::hf::load_causal_lm)");
  }
  if (f.has("architectures")) {
    // Every BERT architecture holds a BertModel; te-cpp builds that (with its pooler), and a
    // head's tensors are extra (refused by a strict load, named).
    const nlohmann::json& a = f.raw("architectures");
    if (!a.is_array()) f.fail("architectures", "expected a list, got " + a.dump());
    for (const nlohmann::json& name : a) {
      const std::string s = name.is_string() ? name.get<std::string>() : "";
      if (s != "BertModel" && s.rfind("BertFor", 0) != 0 && s != "BertLMHeadModel") {
        f.fail("architectures",
               "entry " + name.dump() + " is not a BERT architecture (BertModel, BertFor...)");
      }
    }
  }
  c.vocab_size = f.integer_or("vocab_size", c.vocab_size);
  c.hidden_size = f.integer_or("hidden_size", c.hidden_size);
  c.num_hidden_layers = f.integer_or("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = f.integer_or("num_attention_heads", c.num_attention_heads);
  c.intermediate_size = f.integer_or("intermediate_size", c.intermediate_size);
  c.max_position_embeddings = f.integer_or("max_position_embeddings", c.max_position_embeddings);
  c.type_vocab_size = f.integer_or("type_vocab_size", c.type_vocab_size);
  c.layer_norm_eps = f.number_or("layer_norm_eps", c.layer_norm_eps);
  if (f.has("pad_token_id")) {
    c.pad_token_id = f.integer("pad_token_id");
  } else if (j.contains("pad_token_id")) {
    c.pad_token_id.reset();  // null: no padding row
  }
  c.hidden_dropout = f.number_or("hidden_dropout_prob", c.hidden_dropout);
  c.attention_dropout = f.number_or("attention_probs_dropout_prob", c.attention_dropout);
  // transformers' ACT2FN names: "gelu" is the erf form, "gelu_new" and "gelu_pytorch_tanh" the
  // tanh form (activations.py).
  const std::string act = f.string_or("hidden_act", "gelu");
  if (act == "gelu") {
    c.activation = "gelu_exact";
  } else if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.activation = "gelu";
  } else if (act == "relu" || act == "silu") {
    c.activation = act;
  } else if (act == "swish") {
    c.activation = "silu";
  } else {
    f.fail("hidden_act", "'" + act +
                             "' is not an activation te-cpp builds for BERT (gelu, gelu_new, "
                             "gelu_pytorch_tanh, relu, silu, swish)");
  }
  const std::string positions = f.string_or("position_embedding_type", "absolute");
  if (positions != "absolute") {
    f.fail("position_embedding_type", "'" + positions + "': te-cpp builds absolute positions");
  }
  if (f.boolean_or("is_decoder", false)) {
    f.fail("is_decoder", "true makes BERT a causal decoder; te-cpp builds the encoder");
  }
  if (f.boolean_or("add_cross_attention", false)) {
    f.fail("add_cross_attention", "true adds cross attention; te-cpp builds the encoder alone");
  }
  // Chunking the MLP over the sequence saves memory and changes no value.
  if (f.integer_or("chunk_size_feed_forward", 0) < 0) {
    f.fail("chunk_size_feed_forward", "must not be negative");
  }
  c.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
  // Fields only a task head or training-time memory reads (te-cpp builds no head).
  std::set<std::string> metadata = detail::kMetadata;
  metadata.insert({"classifier_dropout", "gradient_checkpointing", "tie_word_embeddings",
                   "num_labels", "id2label", "label2id", "problem_type"});
  f.refuse_unread(metadata);
  check_encoder_config(c, "'" + path + "'");
  return c;
}

EncoderConfig read_encoder_config(const std::string& dir) {
  const auto [text, path] = detail::read_config_text(dir);
  return parse_encoder_config(text, path);
}

// ---------------------------------------------------------------------------------------------
// The model

nn::TransformerLayerOptions encoder_layer_options(const EncoderConfig& c) {
  // BERT's layer: x1 = LN(x + drop(attn(x))), out = LN(x1 + drop(W2 act(W1 x1))), biases
  // everywhere, keys masked where padding. As TE's layer: no norm before the attention
  // (output_layernorm), the MLP's input norm is the first LN and its residual that norm's output
  // (apply_residual_connection_post_layernorm), the output norm is the second LN.
  auto o = nn::TransformerLayerOptions(c.hidden_size, c.intermediate_size, c.num_attention_heads)
               .layer_type("encoder")
               .mlp_activations({c.activation})
               .hidden_dropout(c.hidden_dropout)
               .intermediate_dropout(0)
               .output_layernorm(true)
               .apply_residual_connection_post_layernorm(true);
  nn::MultiHeadAttentionOptions& attention = o.self_attention();
  attention.use_bias(true).fuse_qkv(false).scaled_query_init(false).scale_attn_logits(true);
  attention.layernorm().layernorm_type("layernorm").epsilon(c.layer_norm_eps);
  attention.attention()
      .attn_mask_type(nn::AttnMaskType::kPadding)
      .attention_dropout(c.attention_dropout);
  return o;
}

EncoderImpl::EncoderImpl(const EncoderConfig& config_) : config(config_) { reset(); }

void EncoderImpl::reset() {
  const EncoderConfig& c = config;
  check_encoder_config(c, "Encoder");
  const LogicalAxes out = {axis::kBatch, axis::kSeqlen, axis::kHidden};
  word = register_module("word", nn::Embedding(nn::EmbeddingOptions(c.vocab_size, c.hidden_size)
                                                   .padding_idx(c.pad_token_id)
                                                   .output_axes(out)));
  position = register_module(
      "position", nn::Embedding(nn::EmbeddingOptions(c.max_position_embeddings, c.hidden_size)
                                    .embedding_axes({kPositionAxis, axis::kEmbed})
                                    .output_axes(out)));
  token_type = register_module("token_type",
                               nn::Embedding(nn::EmbeddingOptions(c.type_vocab_size, c.hidden_size)
                                                 .embedding_axes({kPositionAxis, axis::kEmbed})
                                                 .output_axes(out)));
  embed_norm = register_module(
      "embed_norm", nn::LayerNorm(nn::LayerNormOptions(c.hidden_size).epsilon(c.layer_norm_eps)));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers->push_back(nn::TransformerLayer(encoder_layer_options(c)));
  }
  if (c.pooler) {
    pooler = register_module("pooler", nn::Dense(nn::DenseOptions(c.hidden_size, c.hidden_size)
                                                     .output_axes({axis::kBatch, axis::kHidden})));
  }
}

void EncoderImpl::pretty_print(std::ostream& stream) const {
  stream << "te::hf::Encoder(" << config.model_type << ", layers=" << config.num_hidden_layers
         << ", hidden=" << config.hidden_size << ", heads=" << config.num_attention_heads
         << ", vocab=" << config.vocab_size << (config.pooler ? ", pooler" : "") << ")";
}

namespace {

// [batch, seq] ids' shape -> the key padding mask TE's attention takes ([batch, 1, 1, seq],
// true where masked), or undefined for no padding.
at::Tensor key_padding_mask(const at::Tensor& attention_mask, int64_t batch, int64_t seq) {
  if (!attention_mask.defined()) return at::zeros({batch, 1, 1, seq}, at::kBool);
  TE_CHECK(
      attention_mask.dim() == 2 && attention_mask.size(0) == batch && attention_mask.size(1) == seq,
      "Encoder: attention_mask must be [batch, seq] = [", batch, ", ", seq, "], got ",
      attention_mask.sizes());
  return attention_mask.eq(0).view({batch, 1, 1, seq});
}

at::Tensor whole_ids(const at::Tensor& given, int64_t batch, int64_t seq, const char* what) {
  if (!given.defined()) return at::zeros({batch, seq}, at::kLong);
  TE_CHECK(given.dim() == 2 && given.size(0) == batch && given.size(1) == seq, "Encoder: ", what,
           " must be [batch, seq] = [", batch, ", ", seq, "], got ", given.sizes());
  return given.to(at::kLong);
}

template <typename T>
T run(EncoderImpl& m, const T& ids, int64_t batch, int64_t seq, const at::Tensor& attention_mask,
      const at::Tensor& token_type_ids) {
  const EncoderConfig& c = m.config;
  TE_CHECK(seq <= c.max_position_embeddings, "Encoder: ", seq,
           " tokens are more than the model's max_position_embeddings (", c.max_position_embeddings,
           "); truncate the input");
  const at::Tensor positions = at::arange(seq, at::kLong).expand({batch, seq}).contiguous();
  const at::Tensor types = whole_ids(token_type_ids, batch, seq, "token_type_ids");
  const at::Tensor mask = key_padding_mask(attention_mask, batch, seq);
  T x = F::add(F::add(m.word(ids), m.position(F::laid_out_like(ids, positions))),
               m.token_type(F::laid_out_like(ids, types)));
  x = F::dropout(m.embed_norm(x), c.hidden_dropout, m.is_training());
  for (const auto& layer : *m.layers) {
    x = layer->as<nn::TransformerLayerImpl>()->forward(x, mask);
  }
  return x;
}

at::Tensor tanh_of(const at::Tensor& x) { return at::tanh(x); }
DTensor tanh_of(const DTensor& x) {
  return F::elementwise(x, [](const at::Tensor& t) { return at::tanh(t); });
}

template <typename T>
T run_pool(EncoderImpl& m, const T& hidden) {
  TE_CHECK(m.pooler, "Encoder::pool: this model has no pooler (its checkpoint held none)");
  return tanh_of(m.pooler(F::select(hidden, 1, 0)));
}

}  // namespace

at::Tensor EncoderImpl::forward(const at::Tensor& ids, const at::Tensor& attention_mask,
                                const at::Tensor& token_type_ids) {
  TE_CHECK(ids.dim() == 2, "Encoder: ids must be [batch, seq], got ", ids.sizes());
  return run(*this, ids, ids.size(0), ids.size(1), attention_mask, token_type_ids);
}

DTensor EncoderImpl::forward(const DTensor& ids, const at::Tensor& attention_mask,
                             const at::Tensor& token_type_ids) {
  TE_CHECK(ids.dim() == 2, "Encoder: ids must be [batch, seq], got ", ids.dim(), " dims");
  return run(*this, ids, ids.sizes()[0], ids.sizes()[1], attention_mask, token_type_ids);
}

DTensor EncoderImpl::forward_on_mesh(const at::Tensor& ids, const at::Tensor& attention_mask,
                                     const at::Tensor& token_type_ids) {
  const DeviceMesh* mesh = current_mesh();
  TE_CHECK(mesh != nullptr, "Encoder::forward_on_mesh: no mesh in scope (open a MeshScope)");
  const std::vector<Placement> whole(static_cast<std::size_t>(mesh->ndim()), Replicate{});
  return forward(with_sharding_constraint(DTensor::distribute(ids, *mesh, whole),
                                          {axis::kBatch, axis::kSeqlen}),
                 attention_mask, token_type_ids);
}

at::Tensor EncoderImpl::pool(const at::Tensor& hidden) { return run_pool(*this, hidden); }
DTensor EncoderImpl::pool(const DTensor& hidden) { return run_pool(*this, hidden); }

at::Tensor mean_pool(const at::Tensor& hidden, const at::Tensor& attention_mask) {
  TE_CHECK(hidden.dim() == 3, "mean_pool: hidden must be [batch, seq, hidden], got ",
           hidden.sizes());
  if (!attention_mask.defined()) return hidden.mean(1);
  TE_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == hidden.size(0) &&
               attention_mask.size(1) == hidden.size(1),
           "mean_pool: attention_mask must be [batch, seq] = [", hidden.size(0), ", ",
           hidden.size(1), "], got ", attention_mask.sizes());
  // sentence-transformers' Pooling: sum(h * m) / clamp(sum(m), 1e-9).
  const at::Tensor m = attention_mask.unsqueeze(-1).to(hidden.scalar_type());
  return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9);
}

at::Tensor cls_pool(const at::Tensor& hidden) {
  TE_CHECK(hidden.dim() == 3, "cls_pool: hidden must be [batch, seq, hidden], got ",
           hidden.sizes());
  return hidden.select(1, 0);
}

at::Tensor l2_normalize(const at::Tensor& x) {
  // torch.nn.functional.normalize(p=2, dim=-1, eps=1e-12), as sentence-transformers' Normalize.
  return x / x.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12);
}

// ---------------------------------------------------------------------------------------------
// Loading

WeightMap encoder_weight_map(const EncoderConfig& c, const std::string& prefix) {
  WeightMap m;
  auto whole = [&](const std::string& te, const std::string& hf) { m[te] = {{prefix + hf}}; };
  auto kernel = [&](const std::string& te, const std::string& hf) {
    m[te] = {{prefix + hf, -1, 0, /*transpose=*/true}};
  };
  // A layer norm's scale and bias, a projection's kernel and bias.
  auto norm = [&](const std::string& te, const std::string& hf) {
    whole(te + ".scale", hf + ".weight");
    whole(te + ".ln_bias", hf + ".bias");
  };
  auto dense = [&](const std::string& te_kernel, const std::string& te_bias,
                   const std::string& hf) {
    kernel(te_kernel, hf + ".weight");
    whole(te_bias, hf + ".bias");
  };
  whole("word.embedding", "embeddings.word_embeddings.weight");
  whole("position.embedding", "embeddings.position_embeddings.weight");
  whole("token_type.embedding", "embeddings.token_type_embeddings.weight");
  norm("embed_norm", "embeddings.LayerNorm");
  // Two checkpoint tensors stacked on a te parameter's dim `dim` (K and V), transposed or not.
  auto pair = [&](const std::string& te, const std::string& a, const std::string& b, int64_t dim,
                  bool transpose) {
    m[te] = {{prefix + a, dim, 0, transpose}, {prefix + b, dim, 1, transpose}};
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string te = "layers." + std::to_string(i) + ".";
    const std::string hf = "encoder.layer." + std::to_string(i) + ".";
    const std::string self = hf + "attention.self.";
    dense(te + "self_attention.q_kernel", te + "self_attention.q_bias", self + "query");
    pair(te + "self_attention.kv_kernel", self + "key.weight", self + "value.weight", 1, true);
    pair(te + "self_attention.kv_bias", self + "key.bias", self + "value.bias", 0, false);
    dense(te + "self_attention.out_kernel", te + "self_attention.out_bias",
          hf + "attention.output.dense");
    norm(te + "mlp.layernorm", hf + "attention.output.LayerNorm");
    // fc1's kernel [hidden, 1, ffn] and bias [1, ffn]: one activation slot.
    m[te + "mlp.wi_kernel"] = {{prefix + hf + "intermediate.dense.weight", 1, 0, true}};
    m[te + "mlp.wi_bias"] = {{prefix + hf + "intermediate.dense.bias", 0, 0, false}};
    dense(te + "mlp.wo_kernel", te + "mlp.wo_bias", hf + "output.dense");
    norm(te + "layernorm", hf + "output.LayerNorm");
  }
  if (c.pooler) dense("pooler.kernel", "pooler.bias", "pooler.dense");
  return m;
}

Encoder load_encoder(const std::string& path_text, const LoadOptions& options) {
  const fs::path path = fs::absolute(path_text);
  EncoderConfig config = read_encoder_config(path.string());
  std::unique_ptr<detail::TensorSource> source = detail::open_safetensors_dir(path.string());
  // BertModel saves its tensors bare; BertFor* under "bert.".
  const std::string prefix =
      source->contains("bert.embeddings.word_embeddings.weight") ? "bert." : "";
  config.pooler = source->contains(prefix + "pooler.dense.weight");
  const WeightMap map = encoder_weight_map(config, prefix);
  // position_ids is a buffer transformers saves, not a weight.
  return detail::load_into<Encoder>(
      config,
      {map, "load_encoder", path.string(), config.model_type, /*gguf=*/false, options.strict,
       [prefix](const std::string& name) { return name == prefix + "embeddings.position_ids"; }},
      *source, options);
}

}  // namespace te::hf
