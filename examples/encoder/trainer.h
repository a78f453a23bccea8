#pragma once

// te-encoder's training run: the data read once, then on every rank the model built on the
// run's layout, trained, evaluated, saved and reported.

#include <string>
#include <vector>

#include "options.h"
#include "te/encoder/text.h"

namespace encoder {

/// The data files of a run, read (and so checked) once, before any rank starts training.
struct ColaData {
  std::string train_file;
  std::vector<Example> train, dev, extra;
};
ColaData read_data(const Args& args);

/// Trains (or with --eval-only evaluates) on this rank of `world_size`; returns the exit status.
int train(const Args& args, const Layout& layout, const ColaData& data, int rank, int world_size);

}  // namespace encoder
