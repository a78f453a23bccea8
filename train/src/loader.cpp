// Blocks and packed THD rows from a token file, in a seeded order (te/train/loader.h).

#include "te/train/loader.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "te/error.h"

namespace te::train {
namespace {

constexpr int64_t kIgnore = -100;
// Seeds of the packing order and of each epoch's order, apart from the split's (split.cpp).
constexpr uint64_t kPackingStream = 0x9ac4ed0c0ffee123ULL;

uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<int64_t> in_sequence(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

}  // namespace

DataLoader::DataLoader(TokenFile file, std::vector<int64_t> documents, DataOptions options)
    : file_(std::move(file)), documents_(std::move(documents)), options_(options) {
  const DataOptions& o = options_;
  TE_CHECK(o.seq_len >= 1, "seq_len ", o.seq_len,
           " is below 1; give te-train a --seq-len of 1 or more");
  TE_CHECK(o.batch_size >= 1, "batch size ", o.batch_size,
           " is below 1; give te-train a --batch-size of 1 or more");
  TE_CHECK(o.dp_size >= 1 && o.dp_rank >= 0 && o.dp_rank < o.dp_size, "data-parallel rank ",
           o.dp_rank, " of ", o.dp_size, ": the rank must be in [0, size)");
  TE_CHECK(!documents_.empty(), file_.path(), ": no documents to take batches from");
  for (int64_t d : documents_)
    TE_CHECK(d >= 0 && d < file_.num_documents(), file_.path(), ": document ", d,
             " is not one of its ", file_.num_documents());
  TE_CHECK(!o.packed || (o.pack_align >= 1 && o.seq_len % o.pack_align == 0), "pack_align ",
           o.pack_align, ": each packed sequence's slot is a multiple of it, and so must seq_len ",
           o.seq_len, " be");
  if (o.packed) {
    pack_rows();
  } else {
    const int64_t* offsets = file_.document_offsets();
    stream_starts_.push_back(0);
    for (int64_t d : documents_)
      stream_starts_.push_back(stream_starts_.back() + offsets[d + 1] - offsets[d]);
    const int64_t tokens = stream_starts_.back();
    TE_CHECK(tokens > o.seq_len, file_.path(), ": ", tokens,
             " tokens, shorter than one block "
             "of seq_len + 1 = ",
             o.seq_len + 1, "; use a shorter --seq-len or more data");
    unit_count_ = static_cast<size_t>((tokens - 1) / o.seq_len);
  }
  const int64_t global = o.batch_size * o.dp_size;
  TE_CHECK(num_units() >= global, file_.path(), ": ", num_units(),
           o.packed ? " packed rows" : " blocks", " of ", o.seq_len,
           " tokens, fewer than one global batch of ", global, " (batch size ", o.batch_size, " x ",
           o.dp_size, " data-parallel ranks); use a smaller batch or more data");
}

void DataLoader::pack_rows() {
  const int64_t S = options_.seq_len;
  const int64_t* offsets = file_.document_offsets();
  const auto n = static_cast<int64_t>(documents_.size());
  const std::vector<int64_t> in_order =
      options_.shuffle ? shuffled(n, options_.seed ^ kPackingStream) : in_sequence(n);
  const int64_t align = options_.pack_align;
  int64_t used = 0;
  row_starts_ = {0};
  auto close_row = [&] {
    if (used == 0) return;
    row_starts_.push_back(segments_.size());
    used = 0;
  };
  for (int64_t i : in_order) {
    const int64_t d = documents_[i], end = offsets[d + 1];
    for (int64_t p = offsets[d]; p < end; p += S) {
      const int64_t q = std::min(p + S, end);
      const int64_t slot = (q - p + align - 1) / align * align;  // (S is a multiple of align)
      if (slot > S - used) close_row();
      segments_.push_back({p, q, end});
      used += slot;
      if (used == S) close_row();
    }
  }
  close_row();
  unit_count_ = row_starts_.size() - 1;
}

int64_t DataLoader::steps_per_epoch() const {
  return num_units() / (options_.batch_size * options_.dp_size);
}

const std::vector<int64_t>& DataLoader::order(int64_t epoch) {
  if (order_epoch_ != epoch) {
    order_ = options_.shuffle ? shuffled(num_units(), epoch_seed(options_.seed, epoch))
                              : in_sequence(num_units());
    order_epoch_ = epoch;
  }
  return order_;
}

int64_t DataLoader::label_at(int64_t next, int64_t document_end) const {
  if (next >= document_end) return kIgnore;
  const uint8_t* mask = file_.loss_mask();
  if (mask != nullptr && mask[next] == 0) return kIgnore;
  return file_.tokens()[next];
}

void DataLoader::fill_block(int64_t unit, int64_t* ids, int64_t* labels, int64_t* positions) const {
  const int64_t S = options_.seq_len, first = unit * S;
  const int64_t* offsets = file_.document_offsets();
  // The stream's document holding `first`, then onwards: S + 1 tokens, the last only a label.
  auto j =
      static_cast<size_t>(std::upper_bound(stream_starts_.begin(), stream_starts_.end(), first) -
                          stream_starts_.begin() - 1);
  auto file_pos = [&](int64_t s) {
    while (s >= stream_starts_[j + 1]) ++j;
    return offsets[documents_[j]] + (s - stream_starts_[j]);
  };
  const int64_t n = file_.num_tokens();
  // One pass over the S + 1 stream positions (file_pos only moves forward).
  int64_t here = file_pos(first);
  for (int64_t t = 0; t < S; ++t) {
    const int64_t next = file_pos(first + t + 1);
    ids[t] = file_.tokens()[here];
    labels[t] = label_at(next, n);
    positions[t] = t;
    here = next;
  }
}

int64_t DataLoader::fill_row(int64_t unit, int64_t* ids, int64_t* labels, int64_t* positions,
                             std::vector<int32_t>& cu, std::vector<int32_t>& slots) const {
  const int64_t S = options_.seq_len, align = options_.pack_align;
  int64_t t = 0, longest = 0;
  cu.assign(1, 0);
  slots.assign(1, 0);
  // Padding from t to `end`, positions going on from `position`: nothing to learn.
  auto pad = [&](int64_t end, int64_t position) {
    for (; t < end; ++t, ++position) {
      ids[t] = options_.pad_id;
      labels[t] = kIgnore;
      positions[t] = position;
    }
  };
  for (size_t k = row_starts_[unit]; k < row_starts_[unit + 1]; ++k) {
    const Segment& seg = segments_[k];
    for (int64_t p = seg.begin; p < seg.end; ++p, ++t) {
      ids[t] = file_.tokens()[p];
      labels[t] = label_at(p + 1, seg.document_end);
      positions[t] = p - seg.begin;
    }
    longest = std::max(longest, seg.end - seg.begin);
    cu.push_back(cu.back() + static_cast<int32_t>(seg.end - seg.begin));
    pad((t + align - 1) / align * align, seg.end - seg.begin);  // the slot's end
    slots.push_back(static_cast<int32_t>(t));
  }
  if (t < S) {  // the row's padding: one more sequence, nothing to learn
    longest = std::max(longest, S - t);
    cu.push_back(cu.back() + static_cast<int32_t>(S - t));
    pad(S, 0);
    slots.push_back(static_cast<int32_t>(S));
  }
  return longest;
}

Batch DataLoader::batch(const Position& position) {
  const int64_t B = options_.batch_size, S = options_.seq_len;
  TE_CHECK(position.epoch >= 0 && position.step >= 0 && position.step < steps_per_epoch(),
           "data position epoch ", position.epoch, " step ", position.step, " is outside the ",
           steps_per_epoch(), " steps of an epoch of ", file_.path());
  const std::vector<int64_t>& units = order(position.epoch);
  Batch b;
  b.ids = at::empty({B, S}, at::kLong);
  b.labels = at::empty({B, S}, at::kLong);
  b.position_ids = at::empty({B, S}, at::kLong);
  std::vector<int32_t> cu, slots;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t unit = units[(position.step * options_.dp_size + options_.dp_rank) * B + r];
    int64_t* ids = b.ids.data_ptr<int64_t>() + r * S;
    int64_t* labels = b.labels.data_ptr<int64_t>() + r * S;
    int64_t* positions = b.position_ids.data_ptr<int64_t>() + r * S;
    if (!options_.packed) {
      fill_block(unit, ids, labels, positions);
      continue;
    }
    b.max_seqlen.push_back(fill_row(unit, ids, labels, positions, cu, slots));
    auto tensor = [](std::vector<int32_t>& v) {
      return at::from_blob(v.data(), {static_cast<int64_t>(v.size())}, at::kInt).clone();
    };
    b.cu_seqlens.push_back(tensor(cu));
    if (options_.pack_align > 1) b.cu_seqlens_padded.push_back(tensor(slots));
  }
  b.label_tokens = b.labels.ne(kIgnore).sum().item<int64_t>();
  return b;
}

Batch DataLoader::next() {
  Batch b = batch(position_);
  if (++position_.step == steps_per_epoch()) position_ = {position_.epoch + 1, 0};
  return b;
}

void DataLoader::seek(const Position& position) {
  TE_CHECK(position.epoch >= 0 && position.step >= 0 && position.step < steps_per_epoch(),
           "data position epoch ", position.epoch, " step ", position.step, " is outside the ",
           steps_per_epoch(), " steps of an epoch of ", file_.path());
  position_ = position;
}

}  // namespace te::train
