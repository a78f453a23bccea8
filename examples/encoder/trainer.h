#pragma once

// te-encoder's training run: the data read once, then on every rank the model built on the
// run's layout, trained, evaluated, saved and reported.

#include <cstdint>
#include <string>
#include <vector>

#include "options.h"
#include "te/encoder/text.h"

namespace encoder {

/// A set's evaluation: loss, accuracy, Matthews correlation.
struct Evaluation {
  double loss = 0, accuracy = 0, mcc = 0;
  int64_t examples = 0;
};

/// What a run did, for the final lines and --metrics-json.
struct RunSummary {
  double train_loss = 0, train_accuracy = 0;
  Evaluation dev, extra;
  double seconds = 0, samples_per_second = 0;
  int64_t steps = 0;
};

/// The data files of a run, read (and so checked) once, before any rank starts training.
struct ColaData {
  std::string train_file;
  std::vector<Example> train, dev, extra;
};
ColaData read_data(const Args& args);

/// Trains (or with --eval-only evaluates) on this rank of `world_size`; returns the exit status.
int train(const Args& args, const Layout& layout, const ColaData& data, int rank, int world_size);

}  // namespace encoder
