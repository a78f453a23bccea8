// te::hf::SentenceEmbedder: a sentence-transformers folder read strictly (modules.json,
// 1_Pooling/config.json, sentence_bert_config.json as sentence-transformers 6.2.0 writes them)
// and its encode: tokenize, encode, pool, normalize.

#include "te/hf/sentence.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "json_fields.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/inference.h"

namespace te::hf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::optional<json> read_json(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "sentence model: cannot read '", path.string(), "'");
  return detail::parse_json_object(
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
      path.string(), "sentence model");
}

// modules.json: the Transformer in the folder itself, then Pooling, then optionally Normalize.
// Returns whether Normalize is there and the Pooling module's folder.
std::pair<bool, std::string> read_modules(const fs::path& dir) {
  const fs::path path = dir / "modules.json";
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "sentence model: cannot read '", path.string(), "'");
  json modules;
  try {
    modules = json::parse(in);
  } catch (const json::exception& e) {
    TE_FAIL("sentence model: '", path.string(), "' is not JSON: ", e.what());
  }
  TE_CHECK(modules.is_array(), "sentence model: '", path.string(), "' is not a list of modules");
  static const std::vector<std::string> kOrder = {"sentence_transformers.models.Transformer",
                                                  "sentence_transformers.models.Pooling",
                                                  "sentence_transformers.models.Normalize"};
  TE_CHECK(modules.size() == 2 || modules.size() == 3, "sentence model: '", path.string(),
           "' lists ", modules.size(),
           " modules; te-cpp builds Transformer, Pooling and optionally Normalize");
  std::string pooling_dir;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const json& m = modules[i];
    const std::string type = m.is_object() ? m.value("type", "") : "";
    TE_CHECK(type == kOrder[i], "sentence model: '", path.string(), "': module ", i, " is '", type,
             "'; te-cpp builds ", kOrder[i], " there");
    const std::string sub = m.value("path", "");
    if (i == 0) {
      TE_CHECK(sub.empty(), "sentence model: '", path.string(),
               "': the Transformer must be the folder itself (path \"\"), not '", sub, "'");
    }
    if (i == 1) pooling_dir = sub;
  }
  TE_CHECK(fs::path(pooling_dir).filename() == pooling_dir && pooling_dir != ".." &&
               !pooling_dir.empty(),
           "sentence model: '", path.string(), "': the Pooling path '", pooling_dir,
           "' is not a folder in the model's");
  return {modules.size() == 3, pooling_dir};
}

// 1_Pooling/config.json: exactly one of the mean and CLS modes.
std::string read_pooling(const fs::path& path, int64_t hidden) {
  const std::optional<json> j = read_json(path);
  TE_CHECK(j.has_value(), "sentence model: '", path.string(), "' is missing");
  detail::Fields f(*j, path.string(), "", "sentence model");
  const int64_t dim = f.integer_or("word_embedding_dimension", hidden);
  if (dim != hidden) {
    f.fail("word_embedding_dimension",
           std::to_string(dim) + " is not the encoder's hidden size " + std::to_string(hidden));
  }
  const bool cls = f.boolean_or("pooling_mode_cls_token", false);
  const bool mean = f.boolean_or("pooling_mode_mean_tokens", false);
  for (const char* mode : {"pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                           "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"}) {
    if (f.boolean_or(mode, false)) f.fail(mode, "true: te-cpp pools by mean or CLS only");
  }
  if (!f.boolean_or("include_prompt", true)) {
    f.fail("include_prompt", "false: te-cpp pools over every token");
  }
  if (cls == mean) {
    f.fail("pooling_mode_mean_tokens",
           "give exactly one of pooling_mode_mean_tokens and pooling_mode_cls_token");
  }
  f.refuse_unread({});
  return cls ? "cls" : "mean";
}

}  // namespace

SentenceEmbedder::SentenceEmbedder(const std::string& dir_text, const LoadOptions& options)
    : tokenizer_(Tokenizer::from_pretrained(dir_text)), encoder_(load_encoder(dir_text, options)) {
  TE_CHECK(tokenizer_.vocab_size() <= encoder_->config.vocab_size, "sentence model: '", dir_text,
           "': the tokenizer has ", tokenizer_.vocab_size(),
           " tokens but config.json's vocab_size is ", encoder_->config.vocab_size,
           "; the two files are not one model's");
  try {
    read_folder(dir_text);
  } catch (const json::exception& e) {
    TE_FAIL("sentence model: '", dir_text, "': a field has the wrong type: ", e.what());
  }
}

void SentenceEmbedder::read_folder(const std::string& dir_text) {
  const fs::path dir = dir_text;
  max_length_ = encoder_->config.max_position_embeddings;
  std::error_code ec;
  if (!fs::exists(dir / "modules.json", ec)) return;  // a plain encoder: mean, normalized
  const auto [normalize, pooling_dir] = read_modules(dir);
  normalize_ = normalize;
  pooling_ = read_pooling(dir / pooling_dir / "config.json", encoder_->config.hidden_size);
  if (const std::optional<json> s = read_json(dir / "sentence_bert_config.json")) {
    detail::Fields f(*s, (dir / "sentence_bert_config.json").string(), "", "sentence model");
    max_length_ = f.integer_or("max_seq_length", max_length_);
    if (max_length_ < 3 || max_length_ > encoder_->config.max_position_embeddings) {
      f.fail("max_seq_length", std::to_string(max_length_) +
                                   " is not in [3, max_position_embeddings " +
                                   std::to_string(encoder_->config.max_position_embeddings) + "]");
    }
    // The tokenizer's own lower-casing is in tokenizer.json; this copy is informational.
    f.has("do_lower_case");
    f.refuse_unread({});
  }
}

void SentenceEmbedder::run(const std::vector<std::string>& texts, int64_t batch_size, Info* info,
                           const BatchFn& fn) const {
  TE_CHECK(!texts.empty(), "SentenceEmbedder::embed: no texts");
  TE_CHECK(batch_size >= 0, "SentenceEmbedder::embed: batch_size ", batch_size,
           " is negative; give 0 for one call");
  const auto n = static_cast<int64_t>(texts.size());
  const int64_t step = batch_size == 0 ? n : batch_size;
  // Longest first, ties in the texts' order: every call pads to a near length.
  std::vector<Encoding> encoded;
  for (const std::string& t : texts) encoded.push_back(tokenizer_.encode(t, {true, max_length_}));
  std::vector<int64_t> order(texts.size());
  for (int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return encoded[static_cast<std::size_t>(x)].ids.size() >
           encoded[static_cast<std::size_t>(y)].ids.size();
  });
  if (info != nullptr) {
    *info = Info();
    for (const Encoding& e : encoded) {
      info->tokens.push_back(static_cast<int64_t>(e.ids.size()));
      info->truncated.push_back(e.truncated);
    }
  }
  c10::InferenceMode inference;
  for (int64_t first = 0; first < n; first += step) {
    const int64_t rows = std::min(step, n - first);
    std::vector<Encoding> part;
    for (int64_t r = 0; r < rows; ++r) {
      part.push_back(encoded[static_cast<std::size_t>(order[static_cast<std::size_t>(first + r)])]);
    }
    const Batch b = pad(part, tokenizer_.pad_id());
    at::Tensor hidden;
    if (current_mesh() != nullptr) {
      hidden =
          encoder_.ptr()->forward_on_mesh(b.ids, b.attention_mask, b.token_type_ids).full_tensor();
    } else {
      hidden = encoder_.ptr()->forward(b.ids, b.attention_mask, b.token_type_ids);
    }
    fn(hidden, b.attention_mask,
       at::tensor(std::vector<int64_t>(order.begin() + first, order.begin() + first + rows),
                  at::kLong));
  }
}

at::Tensor SentenceEmbedder::embed(const std::vector<std::string>& texts, int64_t batch_size,
                                   Info* info) const {
  at::Tensor out;
  run(texts, batch_size, info,
      [&](const at::Tensor& hidden, const at::Tensor& attention_mask, const at::Tensor& rows) {
        at::Tensor e = pooling_ == "cls" ? cls_pool(hidden) : mean_pool(hidden, attention_mask);
        if (normalize_) e = l2_normalize(e);
        if (!out.defined()) out = at::empty({static_cast<int64_t>(texts.size()), dimensions()});
        out.index_copy_(0, rows, e.to(at::kFloat));
      });
  return out;
}

int64_t SentenceEmbedder::freeze_fp8_weights(const std::vector<std::string>& calibration,
                                             int64_t batch_size) {
  TE_CHECK(!calibration.empty(),
           "SentenceEmbedder::freeze_fp8_weights: no calibration texts; "
           "give sentences like the ones the model will embed");
  TE_CHECK(!nn::has_fp8_weights(*encoder_),
           "SentenceEmbedder::freeze_fp8_weights: the model already holds FP8 weights");
  {
    // Every GEMM's input and kernel amax over the texts, in high precision: its input scale.
    Fp8Autocast calibrate(/*enabled=*/false, fp8::DelayedScaling{}, std::nullopt,
                          /*calibrating=*/true);
    run(calibration, batch_size, nullptr,
        [&](const at::Tensor& hidden, const at::Tensor&, const at::Tensor&) {
          // BertModel's pooler, which sentence-transformers never runs, is frozen with the rest.
          if (encoder_->pooler) encoder_->pool(hidden);
        });
  }
  return nn::freeze_fp8_weights(*encoder_);
}

}  // namespace te::hf
