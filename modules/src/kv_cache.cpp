#include "te/nn/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <string>

#include "te/error.h"

namespace te::nn {

InferenceParams::InferenceParams(const InferenceParamsOptions& o) : options_(o) {
  TE_CHECK(o.max_batch_size() > 0 && o.max_sequence_length() > 0,
           "InferenceParams: max_batch_size (", o.max_batch_size(), ") and max_sequence_length (",
           o.max_sequence_length(), ") must be positive");
  TE_CHECK(o.num_heads_kv() > 0 && o.head_dim_k() > 0 && o.head_dim_v() >= 0,
           "InferenceParams: num_heads_kv (", o.num_heads_kv(), ") and head_dim_k (",
           o.head_dim_k(), ") must be positive");
  TE_CHECK(at::isFloatingType(o.dtype()), "InferenceParams: dtype ", o.dtype(),
           " is not a floating type");
  if (o.is_paged()) {
    TE_CHECK(o.page_size() > 0 && o.total_num_pages() > 0,
             "InferenceParams: is_paged needs page_size (", o.page_size(),
             ") and total_num_pages (", o.total_num_pages(), ") > 0");
  } else {
    TE_CHECK(o.page_size() == 0 && o.total_num_pages() == 0,
             "InferenceParams: page_size and total_num_pages are for is_paged(true)");
  }
  reset();
}

int64_t InferenceParams::block_tokens() const {
  return options_.is_paged() ? options_.page_size() : options_.max_sequence_length();
}

int64_t InferenceParams::total_blocks() const {
  return options_.is_paged() ? options_.total_num_pages() : options_.max_batch_size();
}

int64_t InferenceParams::blocks_for(int64_t tokens) const {
  return (tokens + block_tokens() - 1) / block_tokens();
}

int64_t InferenceParams::seqlen(int64_t id) const {
  const auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second.length;
}

int64_t InferenceParams::allocated_bytes() const {
  int64_t bytes = 0;
  for (const auto& [layer, kv] : layers_) bytes += kv.first.nbytes() + kv.second.nbytes();
  return bytes;
}

void InferenceParams::reset() {
  sequences_.clear();
  free_.clear();
  for (int64_t b = total_blocks() - 1; b >= 0; --b) free_.push_back(b);  // block 0 taken first
  ids_.clear();
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  cu_q_ = at::zeros({1}, i64);
  cu_kv_ = at::zeros({1}, i64);
  pre_ = at::zeros({0}, i64);
  write_rows_ = at::zeros({0}, i64);
  read_rows_ = at::zeros({0}, i64);
  query_rows_ = at::zeros({0}, i64);
  padding_mask_ = at::zeros({0, 1, 0, 0}, at::kBool);
  seqlens_kv_ = at::zeros({0}, i64);
  max_q_ = max_kv_ = new_tokens_ = 0;
  stepped_.clear();
}

void InferenceParams::end(int64_t id) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  for (auto b = it->second.blocks.rbegin(); b != it->second.blocks.rend(); ++b) free_.push_back(*b);
  sequences_.erase(it);
}

void InferenceParams::check_step(const std::vector<std::pair<int64_t, int64_t>>& step) const {
  const InferenceParamsOptions& o = options_;
  TE_CHECK(!step.empty(), "InferenceParams::pre_step: the step has no sequences");
  TE_CHECK(static_cast<int64_t>(step.size()) <= o.max_batch_size(),
           "InferenceParams::pre_step: ", step.size(), " sequences are more than max_batch_size ",
           o.max_batch_size());
  std::set<int64_t> in_step;
  int64_t blocks_needed = 0, blocks_freed = 0;
  for (const auto& [id, count] : step) {
    TE_CHECK(in_step.insert(id).second, "InferenceParams::pre_step: sequence ", id,
             " appears twice in the step");
    TE_CHECK(count >= 1, "InferenceParams::pre_step: sequence ", id, " brings ", count,
             " new tokens (at least 1)");
    const auto it = sequences_.find(id);
    const int64_t before = it == sequences_.end() ? 0 : it->second.length;
    TE_CHECK(before + count <= o.max_sequence_length(), "InferenceParams::pre_step: sequence ", id,
             " would hold ", before + count, " tokens, more than max_sequence_length ",
             o.max_sequence_length());
    blocks_needed += blocks_for(before + count) -
                     (it == sequences_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size()));
  }
  for (const auto& [id, seq] : sequences_) {
    if (!in_step.count(id)) blocks_freed += static_cast<int64_t>(seq.blocks.size());
  }
  TE_CHECK(blocks_needed <= free_blocks() + blocks_freed,
           "InferenceParams::pre_step: the step needs ", blocks_needed,
           o.is_paged() ? " more pages" : " more slots", " and ", free_blocks() + blocks_freed,
           " are free (", o.is_paged() ? "total_num_pages " : "max_batch_size ", total_blocks(),
           "); end some sequences or make the cache larger");
}

void InferenceParams::pre_step(const std::vector<std::pair<int64_t, int64_t>>& step) {
  check_step(step);  // everything is checked before anything changes
  // Sequences absent from the step have ended (as TE's pre_step: inference.py L483-503).
  std::set<int64_t> in_step;
  for (const auto& [id, count] : step) in_step.insert(id);
  std::vector<int64_t> ended;
  for (const auto& [id, seq] : sequences_) {
    if (!in_step.count(id)) ended.push_back(id);
  }
  for (int64_t id : ended) end(id);
  const int64_t n = static_cast<int64_t>(step.size()), bt = block_tokens();
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  ids_.clear();
  cu_q_ = at::empty({n + 1}, i64);
  cu_kv_ = at::empty({n + 1}, i64);
  pre_ = at::empty({n}, i64);
  auto* cq = cu_q_.data_ptr<int64_t>();
  auto* ckv = cu_kv_.data_ptr<int64_t>();
  auto* pre = pre_.data_ptr<int64_t>();
  cq[0] = ckv[0] = 0;
  max_q_ = max_kv_ = 0;
  std::vector<std::vector<int64_t>> rows(static_cast<std::size_t>(n));
  std::vector<int64_t> write;
  for (int64_t i = 0; i < n; ++i) {
    const auto [id, count] = step[static_cast<std::size_t>(i)];
    Sequence& seq = sequences_[id];
    pre[i] = seq.length;
    seq.length += count;
    while (static_cast<int64_t>(seq.blocks.size()) < blocks_for(seq.length)) {
      seq.blocks.push_back(free_.back());
      free_.pop_back();
    }
    auto& r = rows[static_cast<std::size_t>(i)];
    for (int64_t p = 0; p < seq.length; ++p) {
      r.push_back(seq.blocks[static_cast<std::size_t>(p / bt)] * bt + p % bt);
    }
    write.insert(write.end(), r.begin() + pre[i], r.end());
    ids_.push_back(id);
    cq[i + 1] = cq[i] + count;
    ckv[i + 1] = ckv[i] + seq.length;
    max_q_ = std::max(max_q_, count);
    max_kv_ = std::max(max_kv_, seq.length);
  }
  new_tokens_ = cq[n];
  stepped_.clear();
  write_rows_ = at::tensor(write, i64);
  lay_out_step(rows);
}

void InferenceParams::lay_out_step(const std::vector<std::vector<int64_t>>& rows) {
  // The padded geometry: [batch, max_kv] pool rows (padding reads the zero row), the packed
  // queries' places in [batch, max_q], and what is padding.
  const int64_t n = static_cast<int64_t>(rows.size()), bt = block_tokens();
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const auto* cq = cu_q_.data_ptr<int64_t>();
  const auto* ckv = cu_kv_.data_ptr<int64_t>();
  const int64_t zero_row = total_blocks() * bt;
  read_rows_ = at::full({n, max_kv_}, zero_row, i64);
  query_rows_ = at::empty({new_tokens_}, i64);
  padding_mask_ = at::ones({n, 1, max_q_, max_kv_}, at::kBool);
  auto* read = read_rows_.data_ptr<int64_t>();
  auto* qr = query_rows_.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = rows[static_cast<std::size_t>(i)];
    std::copy(r.begin(), r.end(), read + i * max_kv_);
    for (int64_t t = cq[i]; t < cq[i + 1]; ++t) qr[t] = i * max_q_ + t - cq[i];
    padding_mask_[i][0]
        .narrow(0, 0, cq[i + 1] - cq[i])
        .narrow(1, 0, ckv[i + 1] - ckv[i])
        .fill_(false);
  }
  read_rows_ = read_rows_.view({-1});
  seqlens_kv_ = (cu_kv_.slice(0, 1) - cu_kv_.slice(0, 0, n)).contiguous();
}

void InferenceParams::store(int64_t layer, const at::Tensor& k, const at::Tensor& v) {
  const InferenceParamsOptions& o = options_;
  TE_CHECK(!ids_.empty(), "InferenceParams::step: call pre_step first");
  TE_CHECK(!stepped_.count(layer), "InferenceParams::step: layer ", layer,
           " was already stepped since pre_step; give each layer its own layer_number "
           "(AttentionArgs::layer_number) and call pre_step before each step");
  const int64_t dv = o.head_dim_v() != 0 ? o.head_dim_v() : o.head_dim_k();
  TE_CHECK(k.dim() == 3 && v.dim() == 3 && k.size(0) == new_tokens_ && v.size(0) == new_tokens_ &&
               k.size(1) == v.size(1) && k.size(2) == o.head_dim_k() && v.size(2) == dv,
           "InferenceParams::step: layer ", layer, " gives k ", k.sizes(), " and v ", v.sizes(),
           "; the step has ", new_tokens_, " new tokens, so [", new_tokens_, ", kv heads, ",
           o.head_dim_k(), "] and [", new_tokens_, ", kv heads, ", dv, "]");
  TE_CHECK(o.num_heads_kv() % k.size(1) == 0, "InferenceParams::step: layer ", layer, " gives ",
           k.size(1), " key/value heads, not a share of the cache's num_heads_kv ",
           o.num_heads_kv());
  auto it = layers_.find(layer);
  if (it == layers_.end()) {  // TE's allocate_memory, on this rank's heads and device
    const int64_t rows = total_blocks() * block_tokens() + 1;  // + the zero row of padding
    const auto opts = k.options().dtype(o.dtype()).requires_grad(false);
    it = layers_
             .emplace(layer, std::make_pair(at::zeros({rows, k.size(1), o.head_dim_k()}, opts),
                                            at::zeros({rows, k.size(1), dv}, opts)))
             .first;
  }
  auto& [k_pool, v_pool] = it->second;
  TE_CHECK(k_pool.size(1) == k.size(1) && k_pool.device() == k.device(),
           "InferenceParams::step: layer ", layer, " was allocated for ", k_pool.size(1),
           " key/value heads on ", k_pool.device(), " and now gives ", k.size(1), " on ",
           k.device());
  stepped_.insert(layer);
  const at::Tensor write = write_rows_.to(k.device());
  k_pool.index_copy_(0, write, k.detach().to(o.dtype()));
  v_pool.index_copy_(0, write, v.detach().to(o.dtype()));
}

std::pair<at::Tensor, at::Tensor> InferenceParams::pools(int64_t layer) const {
  const auto it = layers_.find(layer);
  TE_CHECK(it != layers_.end(), "InferenceParams: layer ", layer, " has stored nothing yet");
  return it->second;
}

std::pair<at::Tensor, at::Tensor> InferenceParams::step(int64_t layer, const at::Tensor& k,
                                                        const at::Tensor& v) {
  store(layer, k, v);
  const auto& [k_pool, v_pool] = layers_.at(layer);
  const at::Tensor read = read_rows_.to(k.device());
  const int64_t n = batch_size();
  return {
      k_pool.index_select(0, read).view({n, max_kv_, k.size(1), k.size(2)}).to(k.scalar_type()),
      v_pool.index_select(0, read).view({n, max_kv_, v.size(1), v.size(2)}).to(v.scalar_type())};
}

}  // namespace te::nn
