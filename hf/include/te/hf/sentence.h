#pragma once

// te::hf::SentenceEmbedder: a sentence-transformers model folder (all-MiniLM-L6-v2 and its kind:
// modules.json, a BERT in the folder itself, 1_Pooling/config.json, an optional Normalize) as
// one object that turns texts into embeddings: te::hf::Tokenizer, te::hf::Encoder, the pooling
// the folder names and, when modules.json lists it, unit length. Equal to sentence-transformers'
// encode (tests/interop/check_minilm.py).
//
// Example:
//   te::hf::SentenceEmbedder st("all-MiniLM-L6-v2/");
//   at::Tensor e = st.embed({"A man is eating food.", "A man is eating pasta."});  // [2, 384]
//   double cosine = (e[0] * e[1]).sum().item<double>();

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "te/hf/encoder.h"
#include "te/hf/tokenizer.h"

namespace te::hf {

class SentenceEmbedder {
 public:
  /// Reads `dir`: its tokenizer, its encoder (load_encoder, under the mesh and rules in scope),
  /// modules.json (Transformer, Pooling, optionally Normalize), 1_Pooling/config.json (mean or
  /// CLS pooling) and sentence_bert_config.json (max_seq_length; without it the encoder's
  /// max_position_embeddings). A folder without modules.json is a plain encoder: mean pooling,
  /// normalized. te::Error naming the file and field for a module or pooling mode te-cpp does
  /// not implement.
  explicit SentenceEmbedder(const std::string& dir, const LoadOptions& options = {});

  /// What embed saw of each text.
  struct Info {
    std::vector<int64_t> tokens;  ///< tokens embedded (special tokens included)
    std::vector<bool> truncated;  ///< longer than max_length() tokens: cut there
  };
  /// Embeddings [texts, hidden] (float32, whole on every rank, in the texts' order), computed
  /// under c10::InferenceMode in model calls of at most `batch_size` texts (0: one call), the
  /// texts sorted by token count first so each call pads little (as sentence-transformers'
  /// encode does). `info`, when given, receives each text's token count and truncation.
  at::Tensor embed(const std::vector<std::string>& texts, int64_t batch_size = 0,
                   Info* info = nullptr) const;

  /// FP8 weights for serving: runs `calibration` through the model in high precision (in calls of
  /// `batch_size` texts), recording every GEMM's input amax (te::Fp8Autocast calibrating), then
  /// holds every GEMM kernel and embedding table as E4M3 codes (te::nn::freeze_fp8_weights): about
  /// a quarter of the fp32 weights' bytes. Inputs outside the calibrated range saturate, so
  /// calibrate on texts like the ones the model will embed. The model must be whole on this
  /// process. Returns the number of kernels and tables frozen.
  int64_t freeze_fp8_weights(const std::vector<std::string>& calibration, int64_t batch_size = 32);

  int64_t dimensions() const { return encoder_->config.hidden_size; }
  int64_t max_length() const { return max_length_; }
  const std::string& pooling() const { return pooling_; }  ///< "mean" or "cls"
  bool normalize() const { return normalize_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Encoder& encoder() const { return encoder_; }

 private:
  void read_folder(const std::string& dir);  // modules.json, pooling, max_seq_length
  // Tokenizes `texts`, longest first, and calls fn(hidden, attention_mask, rows) for each model
  // call of at most `batch_size` texts (rows: their indices in `texts`), under InferenceMode.
  using BatchFn = std::function<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  void run(const std::vector<std::string>& texts, int64_t batch_size, Info* info,
           const BatchFn& fn) const;
  Tokenizer tokenizer_;
  Encoder encoder_{nullptr};
  std::string pooling_ = "mean";
  bool normalize_ = true;
  int64_t max_length_ = 0;
};

}  // namespace te::hf
