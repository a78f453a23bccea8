// open_data: token files, split and loaders (te/train/data.h).

#include "te/train/data.h"

#include "te/error.h"

namespace te::train {

Data open_data(const DataSpec& spec, const te::hf::Tokenizer& tokenizer) {
  TE_CHECK(spec.eval_path.empty() || (spec.eval_fraction == 0.0 && spec.eval_count == 0),
           "an eval file (", spec.eval_path, ") and a held-out fraction or count: give one");
  TokenFile train_file = TokenFile::open_or_build(spec.train_path, tokenizer, spec.tokens);
  DataOptions eval_options = spec.batches;
  eval_options.shuffle = false;
  if (!spec.eval_path.empty()) {
    TokenFileOptions eval_tokens = spec.tokens;
    eval_tokens.path = "";
    TokenFile eval_file = TokenFile::open_or_build(spec.eval_path, tokenizer, eval_tokens);
    std::vector<int64_t> all(static_cast<size_t>(train_file.num_documents()));
    for (size_t d = 0; d < all.size(); ++d) all[d] = static_cast<int64_t>(d);
    std::vector<int64_t> eval_all(static_cast<size_t>(eval_file.num_documents()));
    for (size_t d = 0; d < eval_all.size(); ++d) eval_all[d] = static_cast<int64_t>(d);
    return {DataLoader(train_file, std::move(all), spec.batches),
            DataLoader(eval_file, std::move(eval_all), eval_options)};
  }
  Split split = split_documents(train_file.num_documents(), spec.eval_fraction, spec.eval_count,
                                spec.batches.seed);
  Data data{DataLoader(train_file, std::move(split.train), spec.batches), std::nullopt};
  if (!split.eval.empty()) data.eval.emplace(train_file, std::move(split.eval), eval_options);
  return data;
}

}  // namespace te::train
