#pragma once

// Batches from a token file (train/README.md):
//   - blocks (DataOptions::packed false): the documents' tokens as one stream, block k the
//     tokens [k·S, k·S + S] (S = seq_len): ids its first S, labels its last S, positions
//     0..S-1; attention may cross documents, as in GPT-2's pretraining;
//   - packed: documents (in an order fixed by the seed) packed into rows of S tokens, each row
//     a THD batch: cu_seqlens (int32: 0, len0, len0+len1, ..., S; the padding that ends a row is
//     its own last sequence), position_ids restarting at 0 per sequence, labels only within a
//     document. A document longer than S is cut into pieces of S (each its own sequence, whose
//     last token is labelled with the document's next token); a document that does not fit in
//     what is left of a row starts the next row. With pack_align > 1 each sequence takes a slot
//     of a multiple of pack_align tokens (TE's pad_thd_sequences_for_cp: 2·cp under context
//     parallelism), its padding after it (pad_id, labels -100, positions going on), and the
//     row carries cu_seqlens_padded beside cu_seqlens.
// Labels are -100 (ignored) where the next token is not a training target (the chat loss mask)
// or there is none. The units (blocks or rows) are visited in a seeded order, reshuffled each
// epoch; global batch g of an epoch is units [g·B·n, (g+1)·B·n) of that order (B rows per rank,
// n data-parallel ranks), rank r taking the r-th B of them. An epoch's last incomplete global
// batch is left out. The position (epoch, step) is the whole state: te-train saves state_json()
// in its checkpoint and load_state_json() gives the batches an uninterrupted run would have.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "te/train/token_file.h"

namespace te::train {

struct DataOptions {
  /// Tokens per row (>= 1).
  int64_t seq_len = 0;
  /// Rows per batch on each rank.
  int64_t batch_size = 1;
  /// Pack documents into THD rows (else fixed-length blocks).
  bool packed = false;
  /// Seeds the packing order and each epoch's shuffle.
  uint64_t seed = 0;
  /// Visit the units in a shuffled order (false: in order; evaluation).
  bool shuffle = true;
  /// This rank's place among the data-parallel ranks.
  int64_t dp_rank = 0;
  int64_t dp_size = 1;
  /// The id of a packed row's padding (its labels are -100 whatever it is).
  int64_t pad_id = 0;
  /// Packed: each sequence's slot a multiple of this many tokens (seq_len a multiple of it).
  int64_t pack_align = 1;
};

/// One rank's batch, on the CPU.
struct Batch {
  at::Tensor ids;           ///< [B, S] int64
  at::Tensor labels;        ///< [B, S] int64, -100 where ignored
  at::Tensor position_ids;  ///< [B, S] int64
  /// Packed only: per row, int32 [sequences + 1] (TE's THD format), and its longest sequence;
  /// with pack_align > 1 also each row's slots (cu_seqlens_padded, int32 [sequences + 1]).
  std::vector<at::Tensor> cu_seqlens, cu_seqlens_padded;
  std::vector<int64_t> max_seqlen;
  /// Labels that are not -100 (the loss's denominator, summed over accumulation steps).
  int64_t label_tokens = 0;
};

struct Position {
  int64_t epoch = 0;
  int64_t step = 0;  ///< global batches of `epoch` already taken
  bool operator==(const Position& o) const { return epoch == o.epoch && step == o.step; }
};

/// Documents [0, num_documents) split into training and held-out ones: `eval_count` of them, or
/// else round(eval_fraction · num_documents) (at least one when the fraction is not 0), chosen by
/// `seed`; both lists ascending. te::Error for a fraction outside [0, 1), a negative count or one
/// that leaves no training document.
struct Split {
  std::vector<int64_t> train, eval;
};
Split split_documents(int64_t num_documents, double eval_fraction, int64_t eval_count,
                      uint64_t seed);

class DataLoader {
 public:
  /// Batches of `documents` (indices into `file`'s documents, ascending). te::Error for
  /// seq_len < 1, a bad batch size or rank, or data shorter than one block or global batch.
  DataLoader(TokenFile file, std::vector<int64_t> documents, DataOptions options);

  /// Blocks or packed rows in an epoch.
  int64_t num_units() const { return static_cast<int64_t>(unit_count_); }
  /// Global batches in an epoch.
  int64_t steps_per_epoch() const;
  const DataOptions& options() const { return options_; }

  /// This rank's batch at `position` (not moving the loader's own).
  Batch batch(const Position& position);
  /// The batch at position() then advances it (to the next epoch after its last step).
  Batch next();
  Position position() const { return position_; }
  void seek(const Position& position);

  /// {"epoch", "step", "seed", "units", "seq_len", "packed", "pack_align", "global_batch"}:
  /// te-train's
  /// checkpoint keeps it; load_state_json seeks to it, te::Error naming the field when the data
  /// or the options are not those it was saved with.
  std::string state_json() const;
  void load_state_json(const std::string& json);

 private:
  struct Segment {
    int64_t begin, end, document_end;  ///< token file offsets
  };
  void pack_rows();
  const std::vector<int64_t>& order(int64_t epoch);
  void fill_block(int64_t unit, int64_t* ids, int64_t* labels, int64_t* positions) const;
  int64_t fill_row(int64_t unit, int64_t* ids, int64_t* labels, int64_t* positions,
                   std::vector<int32_t>& cu, std::vector<int32_t>& slots) const;
  int64_t label_at(int64_t next, int64_t document_end) const;

  TokenFile file_;
  std::vector<int64_t> documents_;
  DataOptions options_;
  std::vector<int64_t> stream_starts_;  ///< blocks: stream offset of each document, then the end
  std::vector<Segment> segments_;       ///< packed: the rows' segments in order
  std::vector<size_t> row_starts_;      ///< packed: each row's first segment, then the end
  size_t unit_count_ = 0;
  Position position_;
  int64_t order_epoch_ = -1;  ///< the epoch order_ holds
  std::vector<int64_t> order_;
};

/// The permutation of [0, n) a seed gives (Fisher-Yates over mt19937_64: the same everywhere).
std::vector<int64_t> shuffled(int64_t n, uint64_t seed);

}  // namespace te::train
