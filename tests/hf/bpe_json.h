#pragma once

// A byte-level BPE tokenizer.json as Hugging Face tokenizers saves GPT-2's kind, for tests: the
// tokens (ids in order; texts in ByteLevel's alphabet, 'Ġ' for a space), the merges and one
// special added token.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace te::test {

inline nlohmann::json byte_level_bpe_json(const std::vector<std::string>& tokens,
                                          const std::vector<std::string>& merges,
                                          const std::string& special, int64_t special_id) {
  using json = nlohmann::json;
  json vocab = json::object();
  for (std::size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  auto level = [](bool prefix_space, bool trim) {
    return json{{"type", "ByteLevel"},
                {"add_prefix_space", prefix_space},
                {"trim_offsets", trim},
                {"use_regex", true}};
  };
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", special_id},
             {"content", special},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", false},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", level(false, true)},
          {"post_processor", level(true, false)},
          {"decoder", level(true, true)},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

}  // namespace te::test
