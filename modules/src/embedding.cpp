#include "te/nn/embedding.h"

#include <ATen/ATen.h>

#include <cmath>
#include <ostream>

#include "constrain.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"

namespace te::nn {

namespace functional {

using Placements = std::vector<Placement>;

namespace {

void check_table(const at::Tensor& table, const at::Tensor& ids) {
  TE_CHECK(table.dim() == 2, "embedding: the table is ", table.sizes(),
           "; it must be [rows, columns]");
  TE_CHECK(at::isIntegralType(ids.scalar_type(), /*includeBool=*/false), "embedding: ids are ",
           ids.scalar_type(), "; give integer token ids (e.g. at::kLong)");
}

// Every id in [low, high), else a te::Error naming the first one outside (meta ids: unchecked).
void check_ids(const at::Tensor& ids, int64_t rows) {
  if (ids.numel() == 0 || ids.is_meta()) return;
  const at::Tensor outside = (ids < 0) | (ids >= rows);
  if (!outside.any().item<bool>()) return;
  const at::Tensor flat = ids.reshape({-1});
  const int64_t at = outside.reshape({-1}).nonzero()[0][0].item<int64_t>();
  TE_FAIL("embedding: id ", flat[at].item<int64_t>(), " (element ", at,
          " of the ids) is outside the table's ", rows, " rows [0, ", rows, ")");
}

void check_padding_idx(int64_t padding_idx, int64_t rows) {
  TE_CHECK(padding_idx >= -1 && padding_idx < rows, "embedding: padding_idx ", padding_idx,
           " is outside the table's ", rows, " rows; give a row, or -1 for none");
}

}  // namespace

at::Tensor embedding(const at::Tensor& ids, const at::Tensor& table, int64_t padding_idx) {
  check_table(table, ids);
  check_padding_idx(padding_idx, table.size(0));
  check_ids(ids, table.size(0));
  return at::embedding(table, ids, padding_idx);
}

DTensor embedding(const DTensor& ids, const DTensor& table, int64_t padding_idx) {
  check_table(table.to_local(), ids.to_local());
  check_padding_idx(padding_idx, table.size(0));
  TE_CHECK(ids.mesh() == table.mesh(), "embedding: the ids live on ", ids.mesh().to_string(),
           " but the table on ", table.mesh().to_string(),
           "; build the module under the ids' mesh");
  const std::size_t n = table.placements().size();
  Placements ids_use(n), table_use(n), table_grads(n), out(n);
  for (std::size_t m = 0; m < n; ++m) {
    const Placement& pi = ids.placements()[m];
    const Placement& pt = table.placements()[m];
    TE_CHECK(!is_partial(pi) && !is_partial(pt), "embedding: a Partial ",
             is_partial(pi) ? "id" : "table", " tensor on mesh dim ", m,
             "; ids and tables are never partial sums");
    if (is_shard(pi) || is_replicate(pt)) {
      // Ids split here (data parallel, FSDP): the table whole here, its gradient partial.
      ids_use[m] = pi;
      table_use[m] = Replicate{};
      table_grads[m] = is_shard(pi) ? Placement{Partial{}} : Placement{Replicate{}};
      out[m] = pi;
    } else {
      // Ids whole here, the table split: its rows (vocabulary-parallel) or its columns.
      ids_use[m] = Replicate{};
      table_use[m] = table_grads[m] = pt;
      out[m] = std::get<Shard>(pt).dim == 0 ? Placement{Partial{}} : Placement{Shard{ids.dim()}};
    }
  }
  const at::Tensor ids_local = ids.redistribute(ids_use).to_local();
  const at::Tensor table_local = table.redistribute(table_use, table_grads).to_local();
  check_ids(ids_local, table.size(0));
  // This rank's rows of the table, where they are split.
  const Chunk rows = local_chunks(table.sizes(), table.mesh(), table_use, table.mesh().rank())[0];
  at::Tensor y;
  if (rows.length == table.size(0)) {
    y = at::embedding(table_local, ids_local, padding_idx);
  } else {
    // Other ranks' ids look row 0 up and are zeroed: their gradient is zero whatever row 0 is.
    const at::Tensor elsewhere =
        (ids_local < rows.offset) | (ids_local >= rows.offset + rows.length);
    const bool here = padding_idx >= rows.offset && padding_idx < rows.offset + rows.length;
    y = at::embedding(table_local, (ids_local - rows.offset).masked_fill(elsewhere, 0),
                      here ? padding_idx - rows.offset : -1)
            .masked_fill(elsewhere.unsqueeze(-1), 0);
  }
  std::vector<int64_t> shape = ids.sizes();
  shape.push_back(table.size(1));
  return DTensor::from_local(y, ids.mesh(), out, shape);
}

}  // namespace functional

EmbeddingImpl::EmbeddingImpl(const EmbeddingOptions& options_) : options(options_) { reset(); }

void EmbeddingImpl::reset() {
  TE_CHECK(options.num_embeddings() >= 1 && options.features() >= 1,
           "Embedding: ", options.num_embeddings(), " x ", options.features(),
           " table; give at least one row and one column");
  TE_CHECK(options.embedding_axes().size() == 2, "Embedding: embedding_axes ",
           to_string(options.embedding_axes()), " has ", options.embedding_axes().size(),
           " names; give two (rows, columns), e.g. {\"vocab\", \"embed\"}");
  const int64_t pad = options.padding_idx().value_or(0);
  TE_CHECK(pad >= 0 && pad < options.num_embeddings(), "Embedding: padding_idx ", pad,
           " is outside the table's ", options.num_embeddings(), " rows");
  embedding = register_sharded(*this, "embedding",
                               normal({options.num_embeddings(), options.features()},
                                      1.0 / std::sqrt(static_cast<double>(options.features()))),
                               options.embedding_axes());
}

void EmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::Embedding(" << options.num_embeddings() << ", " << options.features()
         << ", axes=" << to_string(options.embedding_axes()) << ")";
}

bool EmbeddingImpl::freeze_fp8(bool empty) {
  if (fp8_frozen()) return false;
  TE_CHECK(held_blocks("embedding") == nullptr,
           "Embedding: the table is held in GGUF blocks; load it with "
           "te::hf::LoadOptions::dequantize_gguf = true to hold it in FP8 instead");
  TE_CHECK(!is_sharded(),
           "Embedding: the table is sharded; FP8 weights serve on one process "
           "(gather_module first)");
  const std::vector<int64_t> shape = embedding.sizes().vec();
  auto [codes, scale_inv] = empty ? std::make_pair(at::zeros(shape, at::kByte), at::ones(shape[0]))
                                  : fp8::quantize_rows(embedding, fp8::DType::kE4M3);
  fp8_embedding = register_buffer("fp8_embedding", codes);
  fp8_embedding_scale_inv = register_buffer("fp8_embedding_scale_inv", scale_inv);
  release_parameter(*this, "embedding");
  return true;
}

void EmbeddingImpl::forget_member(const std::string& name) {
  if (name != "embedding") return ShardedModule::forget_member(name);
  embedding = at::Tensor();
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& ids) {
  require_unsharded(*this, "Embedding");
  if (const HeldBlocks* held = held_blocks("embedding")) {
    return constrain(block_rows(*held->matrix, ids, "Embedding"), options.output_axes());
  }
  if (fp8_frozen()) {
    const at::Tensor codes = functional::embedding(ids, fp8_embedding);
    const at::Tensor scale_inv =
        fp8_embedding_scale_inv.index_select(0, ids.reshape({-1})).view(ids.sizes());
    return constrain(fp8::dequantize_rows(codes, scale_inv, fp8::DType::kE4M3),
                     options.output_axes());
  }
  return constrain(functional::embedding(ids, embedding, options.padding_idx().value_or(-1)),
                   options.output_axes());
}

DTensor EmbeddingImpl::forward(const DTensor& ids) {
  return constrain(functional::embedding(ids, as_dtensor("embedding", embedding, ids.mesh()),
                                         options.padding_idx().value_or(-1)),
                   options.output_axes());
}

at::Tensor EmbeddingImpl::attend(const at::Tensor& x) {
  require_unsharded(*this, "Embedding::attend");
  if (const HeldBlocks* held = held_blocks("embedding")) {
    return block_linear(x, *held->matrix, "the table of Embedding::attend");
  }
  if (fp8_frozen()) {
    return functional::dense(
        x, fp8::dequantize_rows(fp8_embedding, fp8_embedding_scale_inv, fp8::DType::kE4M3).t());
  }
  return functional::dense(x, embedding.t());
}

DTensor EmbeddingImpl::attend(const DTensor& x) {
  return functional::dense_transposed(x, as_dtensor("embedding", embedding, x.mesh()));
}

}  // namespace te::nn
