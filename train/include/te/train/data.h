#pragma once

// te-train's data layer in one call: the training file tokenized (or its token file reused), a
// held-out split or a separate evaluation file, and their loaders (train/README.md).
//
// Example:
//   auto tok = te::hf::Tokenizer::from_pretrained(dir);
//   auto defaults = te::hf::read_generation_defaults(dir);
//   te::train::DataSpec spec;
//   spec.train_path = "chats.jsonl";
//   spec.eval_fraction = 0.01;
//   spec.tokens.eos_id = defaults.eos_token_ids.at(0);
//   spec.tokens.chat_template = te::gen::ChatTemplate::recognise(defaults.chat_template, dir);
//   spec.batches = {.seq_len = 2048, .batch_size = 4, .packed = true};
//   te::train::Data data = te::train::open_data(spec, tok);
//   te::train::Batch b = data.train.next();

#include <optional>
#include <string>

#include "te/train/loader.h"
#include "te/train/source.h"
#include "te/train/token_file.h"
#include "te/train/tokens.h"

namespace te::train {

struct DataSpec {
  std::string train_path;
  /// A separate evaluation file ("": hold documents of the training file out instead).
  std::string eval_path;
  /// The training file's documents held out for evaluation (with no eval_path): a count, else a
  /// fraction in [0, 1).
  double eval_fraction = 0.0;
  int64_t eval_count = 0;
  /// How both files are tokenized (TokenFileOptions::path names the training one's; the
  /// evaluation file's goes beside it).
  TokenFileOptions tokens;
  /// The training batches; evaluation takes the same rows in order (shuffle off).
  DataOptions batches;
};

struct Data {
  DataLoader train;
  std::optional<DataLoader> eval;
};

Data open_data(const DataSpec& spec, const te::hf::Tokenizer& tokenizer);

}  // namespace te::train
