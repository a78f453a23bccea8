// Weights held in GGUF blocks (te/nn/block_weights.h, te/kernels/ggml.h): every quantized type's
// products and lookups equal the float64 ones of its dequantized values (the decoding itself is
// held to gguf-py by tests/interop/check_gguf.py), on both paths (up to 8 rows from the blocks,
// more through a decoded panel) and with rows anywhere; the modules that hold them serve as with
// float32 weights, and everything that would need the float32 parameter says so.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstring>
#include <random>
#include <vector>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "te/kernels/ggml.h"
#include "te/nn.h"

namespace {

using te::ggml::Type;

// A [rows, cols] matrix of random blocks of `type` with finite scales (the halves a block holds
// set to values near `scale`), its rows stored in reverse order so a row's pointer, not its
// place, says where it is.
struct Blocks {
  std::vector<unsigned char> bytes;
  te::nn::BlockMatrix w;
};

uint16_t half_near(std::mt19937& g, float scale) {
  // Halves of magnitude scale * [1, 2): exponent from scale, random mantissa, random sign.
  int e = 0;
  std::frexp(scale, &e);
  const uint16_t exponent = static_cast<uint16_t>(e - 1 + 15);
  return static_cast<uint16_t>((g() & 1) << 15 | exponent << 10 | (g() & 0x3FF));
}

std::shared_ptr<Blocks> random_blocks(Type type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto b = te::ggml::block_shape(static_cast<uint32_t>(type), "test");
  const int64_t row_bytes = cols / b.elements * b.bytes;
  auto out = std::make_shared<Blocks>();
  out->bytes.resize(static_cast<std::size_t>(rows * row_bytes));
  std::mt19937 g(seed);
  for (auto& c : out->bytes) c = static_cast<unsigned char>(g());
  // Where each type keeps its float16 scales within a block.
  std::vector<int64_t> halves;
  switch (type) {
    case Type::kQ8_0:
    case Type::kQ4_0:
    case Type::kQ5_0:
    case Type::kIQ4_NL:
    case Type::kIQ4_XS:
      halves = {0};
      break;
    case Type::kQ4_1:
    case Type::kQ5_1:
    case Type::kQ4_K:
    case Type::kQ5_K:
      halves = {0, 2};
      break;
    case Type::kQ2_K:
      halves = {80, 82};
      break;
    case Type::kQ3_K:
      halves = {108};
      break;
    case Type::kQ6_K:
      halves = {208};
      break;
    case Type::kMXFP4:  // an E8M0 scale byte, set below
      break;
    default:
      ADD_FAILURE() << "not a quantized type";
  }
  for (int64_t k = 0; k < rows * (cols / b.elements); ++k) {
    if (type == Type::kMXFP4) {  // scales 2^-10 to 2^-7 (levels up to 12: values up to 0.1)
      out->bytes[static_cast<std::size_t>(k * b.bytes)] = static_cast<unsigned char>(117 + g() % 4);
    }
    for (int64_t at : halves) {
      const uint16_t h = half_near(g, 0.01f);
      std::memcpy(&out->bytes[static_cast<std::size_t>(k * b.bytes + at)], &h, 2);
    }
  }
  out->w.type = static_cast<uint32_t>(type);
  out->w.rows = rows;
  out->w.cols = cols;
  for (int64_t r = 0; r < rows; ++r) {
    out->w.row_data.push_back(out->bytes.data() + (rows - 1 - r) * row_bytes);
  }
  return out;
}

// The matrix decoded row by row through te::ggml::dequantize (the decoding gguf-py checks).
at::Tensor decoded(const te::nn::BlockMatrix& w) {
  at::Tensor out = at::empty({w.rows, w.cols}, at::kFloat);
  for (int64_t r = 0; r < w.rows; ++r) {
    te::ggml::dequantize(w.type, w.row_data[r], w.cols, out[r].data_ptr<float>());
  }
  return out;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() / b.abs().max().to(at::kDouble))
      .item<double>();
}

const std::vector<std::pair<Type, int64_t>> kTypes = {
    {Type::kQ8_0, 96},  {Type::kQ4_0, 96},   {Type::kQ4_1, 96},  {Type::kQ5_0, 96},
    {Type::kQ5_1, 96},  {Type::kIQ4_NL, 96}, {Type::kQ2_K, 512}, {Type::kQ3_K, 512},
    {Type::kQ4_K, 512}, {Type::kQ5_K, 512},  {Type::kQ6_K, 512}, {Type::kIQ4_XS, 512},
    {Type::kMXFP4, 96}};

TEST(BlockWeights, ProductsEqualTheDequantizedFloat64OnesForEveryTypeAndRowCount) {
  c10::InferenceMode inference;
  for (const auto& [type, cols] : kTypes) {
    const auto blocks = random_blocks(type, 37, cols, 7);
    const at::Tensor w = decoded(blocks->w).to(at::kDouble);
    // The kernels this CPU runs (AVX-512 for every type here) give the portable loops' bits,
    // which check_gguf.py holds to gguf-py: compared as bytes, so a -0.0 (a negative scale times
    // a zero value, frequent here) written as +0.0 fails too.
    at::Tensor portable = at::empty({blocks->w.rows, cols}, at::kFloat);
    for (int64_t r = 0; r < blocks->w.rows; ++r) {
      te::ggml::dequantize_portable(blocks->w.type, blocks->w.row_data[r], cols,
                                    portable[r].data_ptr<float>());
    }
    const at::Tensor fast = te::nn::dequantize(blocks->w);
    EXPECT_EQ(std::memcmp(fast.data_ptr(), portable.data_ptr(), portable.nbytes()), 0)
        << te::ggml::type_name(static_cast<uint32_t>(type));
    for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 33}) {
      const at::Tensor x = at::randn({m, cols});
      const at::Tensor want = at::matmul(x.to(at::kDouble), w.t());
      const at::Tensor got = te::nn::block_linear(x, blocks->w, "w");
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_LT(rel_err(got, want), 2e-6)
          << te::ggml::type_name(static_cast<uint32_t>(type)) << " with " << m << " rows";
    }
    // Leading dims kept, and the input's dtype returned.
    const at::Tensor x3 = at::randn({2, 3, cols}).to(at::kBFloat16);
    const at::Tensor y3 = te::nn::block_linear(x3, blocks->w, "w");
    EXPECT_EQ(y3.sizes(), (std::vector<int64_t>{2, 3, 37}));
    EXPECT_EQ(y3.scalar_type(), at::kBFloat16);
  }
}

TEST(BlockWeights, AMatrixOfManyPanelsAndThreadsEqualsTheFloat64Product) {
  c10::InferenceMode inference;
  // 1100 x 512 float32 is 2.25 MB: more than one decoded panel.
  const auto blocks = random_blocks(Type::kQ4_1, 1100, 512, 3);
  const at::Tensor w = decoded(blocks->w).to(at::kDouble);
  for (int64_t m : {1, 7, 40}) {
    const at::Tensor x = at::randn({m, 512});
    EXPECT_LT(
        rel_err(te::nn::block_linear(x, blocks->w, "w"), at::matmul(x.to(at::kDouble), w.t())),
        2e-6)
        << m << " rows";
  }
}

// A stack of two types (a Q4_K_M file's Q4_K attn_k beside its Q6_K attn_v): rows of each type,
// interleaved in runs, on both paths, in lookups and whole.
TEST(BlockWeights, RowsOfDifferentTypesMultiplyAsTheirOwn) {
  c10::InferenceMode inference;
  const auto k = random_blocks(Type::kQ4_K, 20, 512, 4);
  const auto v = random_blocks(Type::kQ6_K, 12, 512, 5);
  const auto q = random_blocks(Type::kQ8_0, 9, 512, 6);
  te::nn::BlockMatrix w;
  w.type = k->w.type;
  w.cols = 512;
  for (const auto* part : {&k->w, &v->w, &q->w}) {
    w.row_data.insert(w.row_data.end(), part->row_data.begin(), part->row_data.end());
    w.row_types.insert(w.row_types.end(), part->row_data.size(), part->type);
  }
  w.rows = static_cast<int64_t>(w.row_data.size());
  w.check("kv");
  EXPECT_EQ(w.type_names(), "Q4_K and Q6_K and Q8_0");
  EXPECT_EQ(w.bytes(), k->w.bytes() + v->w.bytes() + q->w.bytes());
  const at::Tensor whole = at::cat({decoded(k->w), decoded(v->w), decoded(q->w)});
  EXPECT_TRUE(te::nn::dequantize(w).equal(whole));
  const at::Tensor w64 = whole.to(at::kDouble);
  for (int64_t m : {1, 3, 9, 33}) {
    const at::Tensor x = at::randn({m, 512});
    EXPECT_LT(rel_err(te::nn::block_linear(x, w, "kv"), at::matmul(x.to(at::kDouble), w64.t())),
              2e-6)
        << m << " rows";
  }
  const at::Tensor ids = at::tensor({40, 0, 25, 19, 20}, at::kLong);
  EXPECT_TRUE(te::nn::block_rows(w, ids, "kv").equal(whole.index_select(0, ids)));
  w.row_types.pop_back();
  EXPECT_ERROR(w.check("kv"), "kv: 40 row types for 41 rows");
  w.row_types.push_back(static_cast<uint32_t>(Type::kBF16));
  EXPECT_ERROR(w.check("kv"), "kv: ggml type BF16 is not a quantized block type");
}

// A mixture's experts held in one matrix (each expert's rows after the last's): each group of
// rows times its own expert's rows, plus that expert's bias; experts with no rows skipped.
TEST(BlockWeights, GroupedProductsTakeEachGroupsExpertsRows) {
  c10::InferenceMode inference;
  const auto blocks = random_blocks(Type::kQ8_0, 4 * 6, 64, 7);  // 4 experts of 6 rows
  const at::Tensor w = decoded(blocks->w).view({4, 6, 64});
  const at::Tensor x = at::randn({7, 64}), bias = at::randn({4, 6});
  const std::vector<int64_t> m_splits = {3, 0, 4};  // experts 1, 2, 3
  const at::Tensor got =
      te::nn::grouped_block_linear(x, blocks->w, 4, m_splits, 1, bias, "the experts' kernel");
  const at::Tensor want = at::cat({at::matmul(x.narrow(0, 0, 3), w[1].t()) + bias[1],
                                   at::matmul(x.narrow(0, 3, 4), w[3].t()) + bias[3]});
  EXPECT_LT(rel_err(got, want), 2e-6);
  EXPECT_ERROR(te::nn::grouped_block_linear(x, blocks->w, 5, m_splits, 1, {}, "experts"),
               "experts: 24 rows are not 5 experts' rows");
  EXPECT_ERROR(te::nn::grouped_block_linear(x, blocks->w, 4, m_splits, 2, {}, "experts"),
               "experts: experts 2..4 of 4");
  EXPECT_ERROR(te::nn::grouped_block_linear(x, blocks->w, 4, {3, 3}, 0, {}, "experts"),
               "experts: m_splits sum to 6 rows of 7");
}

TEST(BlockWeights, LookupsDecodeTheRowsTheyGather) {
  const auto blocks = random_blocks(Type::kQ8_0, 10, 64, 5);
  const at::Tensor ids = at::tensor({3, 0, 9, 3, 3, 7}, at::kLong).view({2, 3});
  const at::Tensor got = te::nn::block_rows(blocks->w, ids, "table");
  EXPECT_TRUE(got.equal(decoded(blocks->w).index_select(0, ids.reshape({-1})).view({2, 3, 64})));
  EXPECT_ERROR(te::nn::block_rows(blocks->w, at::tensor({1, 10}, at::kLong), "table"),
               "table: id 10 is outside the table's 10 rows");
  EXPECT_ERROR(te::nn::block_rows(blocks->w, at::tensor({1.0f}), "table"),
               "table: ids must be integers");
  EXPECT_ERROR(te::nn::block_rows(
                   blocks->w,
                   at::empty({2}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)), "table"),
               "table is held in GGUF blocks, which te-cpp reads on the CPU; the ids are on meta");
}

TEST(BlockWeights, MisuseIsNamed) {
  const auto blocks = random_blocks(Type::kQ4_0, 4, 64, 1);
  const at::Tensor x = at::randn({2, 64}).requires_grad_(true);
  EXPECT_ERROR(te::nn::block_linear(x, blocks->w, "the kernel 'q'"),
               "the kernel 'q' is held in GGUF Q4_0 blocks (inference only) but its input "
               "requires grad");
  EXPECT_ERROR(te::nn::block_linear(at::randn({2, 32}), blocks->w, "the kernel 'q'"),
               "does not contract with [4, 64] weights held in Q4_0 blocks");
  te::nn::BlockMatrix bad = blocks->w;
  bad.type = static_cast<uint32_t>(Type::kF16);
  EXPECT_ERROR(bad.check("m"), "m: ggml type F16 is not a quantized block type");
  bad = blocks->w;
  bad.cols = 48;
  EXPECT_ERROR(bad.check("m"), "needs rows of whole blocks of 32");
  bad = blocks->w;
  bad.row_data.pop_back();
  EXPECT_ERROR(bad.check("m"), "m: 3 row pointers for 4 rows");
}

// A Dense and an Embedding holding blocks serve as with the dequantized float32 weights; what
// needs the parameter is refused, naming it.
TEST(BlockWeights, ModulesServeFromBlocksAndRefuseWhatNeedsFloat32) {
  const auto kernel = random_blocks(Type::kQ8_0, 48, 64, 11);  // [out, in]: Dense(64, 48)
  const auto table = random_blocks(Type::kQ4_1, 20, 64, 12);
  te::nn::Dense dense(te::nn::DenseOptions(64, 48));
  te::nn::Embedding embed(20, 64);
  EXPECT_ERROR(dense->hold_blocks(*dense, "kernel",
                                  {std::make_shared<te::nn::BlockMatrix>(table->w), {}, true}),
               "'kernel' of te::nn::DenseImpl is [64, 48] but the blocks hold a [20, 64] matrix");
  const int64_t before = te::nn::resident_bytes(*dense);
  // A bias cannot be held in another form: refused, and kept.
  EXPECT_ERROR(dense->release_parameter(*dense, "bias"),
               "this module keeps its parameter 'bias' (only kernels and embedding tables");
  EXPECT_TRUE(dense->bias.defined() && dense->named_parameters().contains("bias"));
  dense->hold_blocks(*dense, "kernel",
                     {std::make_shared<te::nn::BlockMatrix>(kernel->w), {}, true});
  embed->hold_blocks(*embed, "embedding",
                     {std::make_shared<te::nn::BlockMatrix>(table->w), {}, false});
  // The modules' members let go of the float32 weights with the parameters.
  EXPECT_FALSE(dense->kernel.defined());
  EXPECT_FALSE(embed->embedding.defined());
  EXPECT_FALSE(dense->named_parameters().contains("kernel"));
  EXPECT_TRUE(te::nn::has_block_weights(*dense));
  // The float32 kernel's bytes gone, the blocks' counted.
  EXPECT_EQ(te::nn::resident_bytes(*dense), before - 64 * 48 * 4 + kernel->w.bytes());
  {
    c10::InferenceMode inference;
    const at::Tensor x = at::randn({3, 5, 64});
    const at::Tensor want = at::matmul(x, decoded(kernel->w).t()) + dense->bias;
    EXPECT_LT(rel_err(dense(x), want), 2e-6);
    const at::Tensor ids = at::tensor({19, 0, 4}, at::kLong);
    EXPECT_TRUE(embed(ids).equal(decoded(table->w).index_select(0, ids)));
    EXPECT_LT(rel_err(embed->attend(x), at::matmul(x, decoded(table->w).t())), 2e-6);
  }
  // Training: the input requires grad (the layer before trains).
  EXPECT_ERROR(dense(at::randn({2, 64}).requires_grad_(true)),
               "the kernel 'kernel' is held in GGUF Q8_0 blocks (inference only)");
  te::test::TempDir dir;
  EXPECT_ERROR(te::nn::save_checkpoint(*dense, (dir / "ckpt").string()),
               "save_checkpoint: 'kernel' is held in GGUF blocks");
  {
    te::nn::Dense plain(te::nn::DenseOptions(64, 48));
    te::nn::save_checkpoint(*plain, (dir / "plain").string());
  }
  te::nn::CheckpointLoadOptions lenient;
  lenient.strict = false;
  EXPECT_ERROR(te::nn::load_checkpoint(*dense, (dir / "plain").string(), lenient),
               "load_checkpoint: 'kernel' is held in GGUF blocks");
  EXPECT_ERROR(te::nn::freeze_fp8_weights(*dense),
               "freeze_fp8_weights: 'kernel' of te::nn::DenseImpl is held in GGUF Q8_0 blocks");
  EXPECT_ERROR(embed->freeze_fp8(), "Embedding: the table is held in GGUF blocks");
  te::DeviceMesh mesh({1}, {"data"});
  EXPECT_ERROR(dense(te::DTensor::from_local(at::randn({2, 64}), mesh, {te::Replicate{}})),
               "in GGUF blocks");
}

}  // namespace
