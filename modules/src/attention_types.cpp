// TE's spellings of option values (te/nn/attention_types.h, and the router's score function of
// te/nn/moe.h), one table per enum: the names of
// transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py,
// multi_head_attention.py and router.py at d0067d0da.

#include "te/nn/attention_types.h"

#include <array>
#include <ostream>

#include "te/error.h"
#include "te/nn/moe_types.h"

namespace te::nn {

namespace {

// Each enum's option name and its values' names, in the enum's order.
template <typename E>
struct Names;
template <>
struct Names<AttnMaskType> {
  static constexpr const char* option = "attn_mask_type";
  static constexpr std::array<const char*, 7> values = {"no_mask",
                                                        "padding",
                                                        "causal",
                                                        "padding_causal",
                                                        "causal_bottom_right",
                                                        "padding_causal_bottom_right",
                                                        "arbitrary"};
};
template <>
struct Names<AttnBiasType> {
  static constexpr const char* option = "core_attention_bias_type";
  static constexpr std::array<const char*, 4> values = {"no_bias", "pre_scale_bias",
                                                        "post_scale_bias", "alibi"};
};
template <>
struct Names<SoftmaxType> {
  static constexpr const char* option = "softmax_type";
  static constexpr std::array<const char*, 3> values = {"vanilla", "off-by-one", "learnable"};
};
template <>
struct Names<QkvFormat> {
  static constexpr const char* option = "qkv_format";
  static constexpr std::array<const char*, 3> values = {"bshd", "sbhd", "thd"};
};
template <>
struct Names<QkNormType> {
  static constexpr const char* option = "qk_norm_type";
  static constexpr std::array<const char*, 4> values = {"RMSNorm", "LayerNorm", "L2Normalization",
                                                        "none"};
};

template <>
struct Names<CpCommType> {
  static constexpr const char* option = "cp_comm_type";
  static constexpr std::array<const char*, 4> values = {"p2p", "all_gather", "a2a", "a2a+p2p"};
};

template <>
struct Names<ScoreFunction> {
  static constexpr const char* option = "score_function";
  static constexpr std::array<const char*, 3> values = {"softmax", "sigmoid", "sqrtsoftplus"};
};

template <>
struct Names<DropPolicy> {
  static constexpr const char* option = "drop_policy";
  static constexpr std::array<const char*, 2> values = {"probs", "position"};
};

template <typename E>
const char* name_of(E value) {
  const auto i = static_cast<std::size_t>(value);
  TE_CHECK(i < Names<E>::values.size(), Names<E>::option, ": value ", i, " is not one of the ",
           Names<E>::values.size(), " this build knows");
  return Names<E>::values[i];
}

}  // namespace

template <typename E>
E parse_te_name(std::string_view name) {
  std::string valid;
  for (std::size_t i = 0; i < Names<E>::values.size(); ++i) {
    if (name == Names<E>::values[i]) return static_cast<E>(i);
    valid += (i ? ", " : "") + std::string(Names<E>::values[i]);
  }
  TE_FAIL(Names<E>::option, " '", name, "' is not one of ", valid);
}

template <typename E>
std::vector<std::string> te_names() {
  return {Names<E>::values.begin(), Names<E>::values.end()};
}

template std::vector<std::string> te_names<AttnMaskType>();
template std::vector<std::string> te_names<AttnBiasType>();
template std::vector<std::string> te_names<SoftmaxType>();
template std::vector<std::string> te_names<QkvFormat>();
template std::vector<std::string> te_names<QkNormType>();
template std::vector<std::string> te_names<CpCommType>();
template std::vector<std::string> te_names<ScoreFunction>();
template std::vector<std::string> te_names<DropPolicy>();

template AttnMaskType parse_te_name<AttnMaskType>(std::string_view);
template AttnBiasType parse_te_name<AttnBiasType>(std::string_view);
template SoftmaxType parse_te_name<SoftmaxType>(std::string_view);
template QkvFormat parse_te_name<QkvFormat>(std::string_view);
template QkNormType parse_te_name<QkNormType>(std::string_view);
template CpCommType parse_te_name<CpCommType>(std::string_view);
template ScoreFunction parse_te_name<ScoreFunction>(std::string_view);
template DropPolicy parse_te_name<DropPolicy>(std::string_view);

const char* te_name(AttnMaskType value) { return name_of(value); }
const char* te_name(AttnBiasType value) { return name_of(value); }
const char* te_name(SoftmaxType value) { return name_of(value); }
const char* te_name(QkvFormat value) { return name_of(value); }
const char* te_name(QkNormType value) { return name_of(value); }
const char* te_name(CpCommType value) { return name_of(value); }
const char* te_name(ScoreFunction value) { return name_of(value); }
const char* te_name(DropPolicy value) { return name_of(value); }

std::ostream& operator<<(std::ostream& s, AttnMaskType value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, AttnBiasType value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, SoftmaxType value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, QkvFormat value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, QkNormType value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, CpCommType value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, ScoreFunction value) { return s << te_name(value); }
std::ostream& operator<<(std::ostream& s, DropPolicy value) { return s << te_name(value); }

}  // namespace te::nn
