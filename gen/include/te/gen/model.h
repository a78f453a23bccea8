#pragma once

// What the Engine drives: a decoder that runs incremental steps over a te::nn KV cache. te::gen
// knows no file format; te::hf::CausalLM implements LanguageModel, and ModelRef takes it as it is
// held (te::gen::Engine engine(causal_lm)).

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "te/distributed/dtensor.h"
#include "te/nn/kv_cache.h"

namespace te::gen {

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;
  /// Token ids run over [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  /// The positions it was trained for; 0: none given (the Engine then takes 2048).
  virtual int64_t max_positions() const = 0;
  /// The InferenceParams options of a KV cache for `max_batch` sequences of `max_length` tokens
  /// (its key/value heads and head dim); paging is set on the result.
  virtual te::nn::InferenceParamsOptions kv_cache_options(int64_t max_batch,
                                                          int64_t max_length) const = 0;
  /// The bytes one token takes in that cache in `dtype` (every layer's keys and values, this
  /// rank's share of the heads not considered).
  virtual int64_t kv_bytes_per_token(at::ScalarType dtype) const = 0;
  /// One step of incremental decoding (eval mode): `ids` [tokens] are the step's new tokens
  /// packed in the order of `cache`'s pre_step; the logits of each sequence's last new token,
  /// [batch, vocab].
  virtual at::Tensor step(const at::Tensor& ids, te::nn::InferenceParams& cache) = 0;
  /// The same on the mesh in scope (the same ids on every rank); logits may stay sharded over the
  /// vocabulary.
  virtual DTensor step_on_mesh(const at::Tensor& ids, te::nn::InferenceParams& cache) = 0;
  /// The module: its training mode and its parameters' layouts (te::nn::named_parameter_layouts).
  virtual const torch::nn::Module& as_module() const = 0;

 protected:
  LanguageModel() = default;
  LanguageModel(const LanguageModel&) = default;
  LanguageModel& operator=(const LanguageModel&) = default;
};

/// A LanguageModel shared with its holder: a std::shared_ptr to one, or a module holder (e.g.
/// te::hf::CausalLM) whose module implements it.
class ModelRef {
 public:
  template <class T, std::enable_if_t<std::is_base_of_v<LanguageModel, T>, int> = 0>
  ModelRef(std::shared_ptr<T> model)  // NOLINT(google-explicit-constructor)
      : model_(std::move(model)) {}
  template <class Holder,
            std::enable_if_t<std::is_base_of_v<LanguageModel, typename Holder::ContainedType>,
                             int> = 0>
  ModelRef(const Holder& holder)  // NOLINT(google-explicit-constructor)
      : model_(holder.ptr()) {}

  LanguageModel& operator*() const { return *model_; }
  LanguageModel* operator->() const { return model_.get(); }

 private:
  std::shared_ptr<LanguageModel> model_;
};

}  // namespace te::gen
