// Context parallelism (te/nn/context_parallel.h): the sequence layout, and attention over a
// sequence split over 2 and 4 thread ranks (alone and beside a data-parallel axis) with each
// cp_comm_type, held to one process's unfused attention (TE's reference semantics): outputs and
// the gradients of q, k and v; the traffic each strategy moves; and the bad input.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;
using test::leaf;
using test::randn;

TEST(ContextParallelLayout, DualChunkSwapAndBack) {
  // cp = 2, 8 tokens: rank 0 holds chunks 0 and 3 (tokens 0 1 6 7), rank 1 chunks 1 and 2.
  const at::Tensor whole = at::arange(8, at::kLong).view({1, 8});
  EXPECT_TRUE(at::equal(F::cp_shard(whole, 1, 2, 0), at::tensor({0, 1, 6, 7}).view({1, 4})));
  EXPECT_TRUE(at::equal(F::cp_shard(whole, 1, 2, 1), at::tensor({2, 3, 4, 5}).view({1, 4})));
  EXPECT_TRUE(at::equal(F::cp_shard(whole, 1, 2, 1, false), at::tensor({4, 5, 6, 7}).view({1, 4})));
  for (int64_t cp : {1, 2, 4}) {
    for (bool balanced : {true, false}) {
      const at::Tensor t = at::arange(48, at::kFloat).view({2, 24});
      std::vector<at::Tensor> pieces;
      for (int64_t r = 0; r < cp; ++r) pieces.push_back(F::cp_shard(t, 1, cp, r, balanced));
      const at::Tensor ranked = at::cat(pieces, 1);
      EXPECT_TRUE(at::equal(F::cp_unshard(ranked, 1, cp, balanced), t)) << cp << balanced;
      EXPECT_TRUE(at::equal(F::cp_rank_order(t, 1, cp, balanced), ranked)) << cp << balanced;
    }
  }
  const auto chunks = F::cp_chunks(16, 4, 1);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].start, 12);  // chunk 2·4-1-1 = 6 of 2 tokens
  EXPECT_ERROR(F::cp_shard(whole.narrow(1, 0, 6), 1, 2, 0),
               "splits a sequence into 4 equal chunks, but it has 6 tokens; pad it to a "
               "multiple of 4");
}

struct CpCase {
  std::string name;
  CpCommType type;
  int64_t cp;
  std::string mask;
  int64_t left = -1, right = -1;  // a sliding window when left >= 0
  int64_t kv_heads = 4;
  bool data_parallel = false;  // a {data: 2, cp: cp} mesh, the batch split over data
  bool load_balanced = true;
  double dropout = 0, softcap = 0;  // the unfused blocks (what the fused kernel does not take)
  int64_t a2a_ways = 2;             // a2a+p2p: the a2a axis' size (the ring's: cp / a2a_ways)
};

// The mesh of cp ranks (a2a+p2p: {ring: cp / a2a_ways, a2a: a2a_ways}, the ring major; beside
// a data axis of 2 when data_parallel) and its ContextParallel.
DeviceMesh cp_mesh(CpCommType type, int64_t cp, int64_t a2a_ways, bool data_parallel) {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  if (data_parallel) {
    shape.push_back(2);
    names.emplace_back("data");
  }
  if (type == CpCommType::kA2AP2P) {
    shape.insert(shape.end(), {cp / a2a_ways, a2a_ways});
    names.insert(names.end(), {"ring", "a2a"});
  } else {
    shape.push_back(cp);
    names.emplace_back("cp");
  }
  return DeviceMesh(shape, names);
}
F::ContextParallel cp_over(const DeviceMesh& mesh, CpCommType type, bool load_balanced = true) {
  if (type == CpCommType::kA2AP2P) {
    return F::ContextParallel(mesh, std::vector<std::string>{"ring", "a2a"}, type, load_balanced);
  }
  return F::ContextParallel(mesh, "cp", type, load_balanced);
}

std::string case_name(const ::testing::TestParamInfo<CpCase>& info) { return info.param.name; }
void PrintTo(const CpCase& c, std::ostream* os) { *os << c.name; }

F::AttentionCall call_of(const CpCase& c, bool fused) {
  F::AttentionCall call;
  call.spec =
      c.left >= 0 ? F::mask_spec(c.mask, WindowSize{c.left, c.right}) : F::mask_spec(c.mask);
  call.scale = 0.35;
  call.fused = fused;
  call.dropout = c.dropout;
  call.training = c.dropout > 0;
  call.softcap = c.softcap;
  return call;
}

class ContextParallelAttention : public ::testing::TestWithParam<CpCase> {};

// One process's q, k, v (their gradients after its backward), output and output weights.
struct OneProcess {
  at::Tensor q, k, v, out, w;
};
using Piece = std::function<at::Tensor(const at::Tensor&)>;

// This rank's context parallel attention of its piece (`mine`) of one's q, k and v, backward
// through its piece of the weights: the output and the gradients are its pieces of one's,
// within 1e-5, and the stream advanced by one process's calls.
void expect_rank_is_one_process(const OneProcess& one, const Piece& mine,
                                const F::AttentionCall& call, const F::ContextParallel& cp,
                                uint64_t seed, const RngState& after) {
  at::Tensor ql = leaf(mine(one.q.detach())), kl = leaf(mine(one.k.detach())),
             vl = leaf(mine(one.v.detach()));
  manual_seed(seed);
  const at::Tensor out = F::context_parallel_attention(ql, kl, vl, call, cp);
  const int64_t rank = cp.rank();
  EXPECT_EQ(rng_state().calls, after.calls) << "rank " << rank;
  (out * mine(one.w)).sum().backward();
  EXPECT_TRUE(Close(out, mine(one.out), 1e-5)) << "output, rank " << rank;
  EXPECT_TRUE(Close(ql.grad(), mine(one.q.grad()), 1e-5)) << "dq, rank " << rank;
  EXPECT_TRUE(Close(kl.grad(), mine(one.k.grad()), 1e-5)) << "dk, rank " << rank;
  EXPECT_TRUE(Close(vl.grad(), mine(one.v.grad()), 1e-5)) << "dv, rank " << rank;
}

// Every rank's output and gradients are its rows of one process's (fp32, within 1e-5), dropout
// included: every block draws its mask at its global place from the call's one stream call, and
// the stream advances by one call, as one process's.
TEST_P(ContextParallelAttention, IsOneProcess) {
  const CpCase c = GetParam();
  const int64_t batch = 2, seq = 16 * c.cp, heads = 4, d = 8;
  const at::Tensor q0 = randn({batch, seq, heads, d}, 1),
                   k0 = randn({batch, seq, c.kv_heads, d}, 2);
  const at::Tensor v0 = randn({batch, seq, c.kv_heads, d}, 3), w = randn({batch, seq, heads, d}, 4);
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
  const bool padded = F::mask_spec(c.mask).padding();
  // Rows of seq - 3 and seq - 6 tokens, the whole sequence's mask as one process takes it.
  const at::Tensor mask =
      padded ? test::padding_mask({seq - 3, seq - 6}, {seq - 3, seq - 6}, seq, seq) : at::Tensor();
  manual_seed(7);
  F::AttentionCall one = call_of(c, false);
  one.mask = mask;
  const at::Tensor ref = F::attention(q, k, v, one);
  const RngState after = rng_state();
  (ref * w).sum().backward();
  const int64_t world = c.cp * (c.data_parallel ? 2 : 1);
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    const DeviceMesh mesh = cp_mesh(c.type, c.cp, c.a2a_ways, c.data_parallel);
    const F::ContextParallel cp = cp_over(mesh, c.type, c.load_balanced);
    const int64_t rows = c.data_parallel ? batch / 2 : batch;
    const int64_t first = c.data_parallel ? mesh.coordinate("data") * rows : 0;
    const auto mine = [&](const at::Tensor& t) {
      return F::cp_shard(t.narrow(0, first, rows), 1, cp.size(), cp.rank(), c.load_balanced);
    };
    F::AttentionCall call = call_of(c, true);
    if (padded) call.mask = mask.narrow(0, first, rows);  // the rank's rows, the whole sequence
    expect_rank_is_one_process({q, k, v, ref.detach(), w}, mine, call, cp, 7, after);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, ContextParallelAttention,
    ::testing::Values(
        CpCase{"p2p_cp2_causal", CpCommType::kP2P, 2, "causal"},
        CpCase{"p2p_cp4_causal", CpCommType::kP2P, 4, "causal"},
        CpCase{"p2p_cp2_no_mask_gqa", CpCommType::kP2P, 2, "no_mask", -1, -1, 2},
        CpCase{"p2p_cp4_causal_gqa_contiguous", CpCommType::kP2P, 4, "causal", -1, -1, 1, false,
               false},
        CpCase{"p2p_dp2_cp2_causal", CpCommType::kP2P, 2, "causal", -1, -1, 4, true},
        CpCase{"all_gather_cp2_causal", CpCommType::kAllGather, 2, "causal"},
        CpCase{"all_gather_cp4_window", CpCommType::kAllGather, 4, "causal", 5, 0},
        CpCase{"all_gather_cp2_both_sides", CpCommType::kAllGather, 2, "no_mask", 7, 3, 2},
        CpCase{"all_gather_dp2_cp2_no_mask", CpCommType::kAllGather, 2, "no_mask", -1, -1, 4, true},
        CpCase{"a2a_cp2_causal_gqa", CpCommType::kA2A, 2, "causal", -1, -1, 2},
        CpCase{"a2a_cp4_window", CpCommType::kA2A, 4, "causal", 9, 0},
        CpCase{"a2a_dp2_cp2_no_mask", CpCommType::kA2A, 2, "no_mask", -1, -1, 4, true},
        CpCase{"p2p_cp2_causal_dropout", CpCommType::kP2P, 2, "causal", -1, -1, 4, false, true,
               0.2},
        CpCase{"p2p_cp4_causal_gqa_dropout_softcap", CpCommType::kP2P, 4, "causal", -1, -1, 2,
               false, true, 0.3, 0.9},
        CpCase{"p2p_cp2_no_mask_contiguous_dropout", CpCommType::kP2P, 2, "no_mask", -1, -1, 4,
               false, false, 0.2},
        CpCase{"all_gather_cp4_window_dropout", CpCommType::kAllGather, 4, "causal", 5, 0, 4, false,
               true, 0.2},
        CpCase{"all_gather_cp2_softcap", CpCommType::kAllGather, 2, "causal", -1, -1, 2, false,
               true, 0, 0.7},
        CpCase{"a2a_cp2_causal_gqa_dropout_softcap", CpCommType::kA2A, 2, "causal", -1, -1, 2,
               false, true, 0.2, 0.8},
        CpCase{"p2p_cp2_padding_causal", CpCommType::kP2P, 2, "padding_causal"},
        CpCase{"p2p_dp2_cp2_padding_bottom_right", CpCommType::kP2P, 2,
               "padding_causal_bottom_right", -1, -1, 2, true},
        CpCase{"p2p_cp2_padding_bottom_right_dropout", CpCommType::kP2P, 2,
               "padding_causal_bottom_right", -1, -1, 2, false, true, 0.2},
        CpCase{"p2p_cp4_padding", CpCommType::kP2P, 4, "padding", -1, -1, 4, false, false},
        CpCase{"all_gather_cp4_padding_causal_window", CpCommType::kAllGather, 4, "padding_causal",
               6, 0, 2},
        CpCase{"a2a_cp2_padding_causal_dropout", CpCommType::kA2A, 2, "padding_causal", -1, -1, 2,
               false, true, 0.2},
        // a2a+p2p: {ring 2, a2a 2}, {ring 2, a2a 4}, {ring 4, a2a 2}; GQA's 2 key/value heads
        // over an a2a axis of 2; beside a data axis; dropout and a padding mask (the ring's
        // unfused blocks); contiguous chunks.
        CpCase{"a2a_p2p_cp4_causal_gqa", CpCommType::kA2AP2P, 4, "causal", -1, -1, 2},
        CpCase{"a2a_p2p_cp8_causal_a2a4", CpCommType::kA2AP2P, 8, "causal", -1, -1, 4, false, true,
               0, 0, 4},
        CpCase{"a2a_p2p_cp8_no_mask_ring4", CpCommType::kA2AP2P, 8, "no_mask"},
        CpCase{"a2a_p2p_dp2_cp4_causal", CpCommType::kA2AP2P, 4, "causal", -1, -1, 4, true},
        CpCase{"a2a_p2p_cp4_padding_causal_dropout", CpCommType::kA2AP2P, 4, "padding_causal", -1,
               -1, 2, false, true, 0.2},
        CpCase{"a2a_p2p_cp4_causal_contiguous_softcap", CpCommType::kA2AP2P, 4, "causal", -1, -1, 4,
               false, false, 0, 0.8}),
    case_name);

// Packed sequences (thd) in TE's layout: each slot a multiple of 2·cp, rank r holding chunks r
// and 2·cp-1-r of every sequence.
TEST(ContextParallelLayout, PackedSequencesInTesLayout) {
  // Slots of 8 and 4 tokens at cp = 2 (chunks of 2 and 1): rank 0 holds 0 1 6 7 | 8 11.
  const at::Tensor slots = at::tensor({0, 8, 12}, at::kLong);
  EXPECT_TRUE(at::equal(F::cp_packed_indices(slots, 2, 0), at::tensor({0, 1, 6, 7, 8, 11})));
  EXPECT_TRUE(at::equal(F::cp_packed_indices(slots, 2, 1), at::tensor({2, 3, 4, 5, 9, 10})));
  const at::Tensor t = at::arange(24, at::kFloat).view({12, 2});
  const at::Tensor ranked =
      at::cat({F::cp_shard_packed(t, 0, slots, 2, 0), F::cp_shard_packed(t, 0, slots, 2, 1)});
  EXPECT_TRUE(at::equal(F::cp_unshard_packed(ranked, 0, slots, 2), t));
  EXPECT_ERROR(F::cp_packed_indices(at::tensor({0, 8, 14}, at::kLong), 2, 0),
               "sequence 1 has a slot of 6 tokens (cu_seqlens_padded[1..2]); pad each sequence "
               "to a multiple of 4");
  EXPECT_ERROR(F::cp_shard_packed(t.narrow(0, 0, 10), 0, slots, 2, 0),
               "is not the whole packed tensor's 12 tokens");
}

struct PackedCase {
  std::string name;
  CpCommType type;
  int64_t cp;
  std::string mask;
  std::vector<int64_t> lengths, slots;  // each sequence's tokens and slot
  int64_t left = -1;                    // a sliding window when >= 0
  double dropout = 0;
  int64_t kv_heads = 2;
  bool padded = true;             // cu_seqlens_padded given (else the sequences are the slots)
  int64_t max_q = 0, max_kv = 0;  // max_seqlen_q / max_seqlen_kv (where dropout draws)
};
std::string packed_name(const ::testing::TestParamInfo<PackedCase>& info) {
  return info.param.name;
}
void PrintTo(const PackedCase& c, std::ostream* os) { *os << c.name; }

at::Tensor cumulative(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> cu = {0};
  for (const int64_t n : sizes) cu.push_back(cu.back() + n);
  return at::tensor(cu, at::kLong);
}

class ContextParallelPacked : public ::testing::TestWithParam<PackedCase> {};

// Every rank's output and gradients are its tokens of one process's packed attention (each
// sequence alone, the padding slots zeros), dropout included.
TEST_P(ContextParallelPacked, IsOneProcess) {
  const PackedCase c = GetParam();
  const at::Tensor cu = cumulative(c.lengths), slots = cumulative(c.slots);
  const int64_t tokens = slots[-1].item<int64_t>(), heads = 4, d = 8;
  const at::Tensor q0 = randn({tokens, heads, d}, 11), k0 = randn({tokens, c.kv_heads, d}, 12);
  const at::Tensor v0 = randn({tokens, c.kv_heads, d}, 13), w = randn({tokens, heads, d}, 14);
  F::AttentionCall call;
  call.spec = c.left >= 0 ? F::mask_spec(c.mask, WindowSize{c.left, 0}) : F::mask_spec(c.mask);
  call.scale = 0.35;
  call.dropout = c.dropout;
  call.training = c.dropout > 0;
  call.packed.cu_seqlens_q = call.packed.cu_seqlens_kv = cu;
  if (c.padded) call.packed.cu_seqlens_q_padded = call.packed.cu_seqlens_kv_padded = slots;
  call.packed.max_seqlen_q = c.max_q;
  call.packed.max_seqlen_kv = c.max_kv;
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
  manual_seed(9);
  const at::Tensor ref = F::attention(q, k, v, call);
  const RngState after = rng_state();
  (ref * w).sum().backward();
  run_local_ranks(static_cast<int>(c.cp), [&](int rank) {
    const F::ContextParallel cp = cp_over(cp_mesh(c.type, c.cp, 2, false), c.type);
    const auto mine = [&](const at::Tensor& t) {
      return F::cp_shard_packed(t, 0, slots, c.cp, rank);
    };
    expect_rank_is_one_process({q, k, v, ref.detach(), w}, mine, call, cp, 9, after);
  });
}

// Sequences of 13, 5, 8 and 1 tokens in slots of 16, 8, 8 and 4 (cp 2: chunks of 4, 2, 2, 1), and
// of 13, 5, 16, 1 in 16, 8, 16, 8 (cp 4); the last case leaves rank 1 only padding.
const std::vector<int64_t> kLengths2 = {13, 5, 8, 1}, kSlots2 = {16, 8, 8, 4},
                           kLengths4 = {13, 5, 16, 1}, kSlots4 = {16, 8, 16, 8};
INSTANTIATE_TEST_SUITE_P(
    Strategies, ContextParallelPacked,
    ::testing::Values(
        PackedCase{"p2p_cp2_padding_causal", CpCommType::kP2P, 2, "padding_causal", kLengths2,
                   kSlots2},
        PackedCase{"p2p_cp4_padding", CpCommType::kP2P, 4, "padding", kLengths4, kSlots4},
        PackedCase{"p2p_cp2_padding_causal_dropout", CpCommType::kP2P, 2, "padding_causal",
                   kLengths2, kSlots2, -1, 0.2},
        PackedCase{"p2p_cp4_bottom_right_dropout", CpCommType::kP2P, 4,
                   "padding_causal_bottom_right", kLengths4, kSlots4, -1, 0.2},
        PackedCase{"p2p_cp2_a_rank_of_padding_dropout",
                   CpCommType::kP2P,
                   2,
                   "padding_causal",
                   {1, 1},
                   {8, 4},
                   -1,
                   0.2},
        PackedCase{"all_gather_cp2_padding_causal", CpCommType::kAllGather, 2, "padding_causal",
                   kLengths2, kSlots2},
        PackedCase{"all_gather_cp4_window", CpCommType::kAllGather, 4, "padding_causal", kLengths4,
                   kSlots4, 3},
        PackedCase{"all_gather_cp2_window_dropout", CpCommType::kAllGather, 2, "padding_causal",
                   kLengths2, kSlots2, 3, 0.2},
        PackedCase{"all_gather_cp2_a_rank_of_padding",
                   CpCommType::kAllGather,
                   2,
                   "padding",
                   {1, 1},
                   {8, 4},
                   -1,
                   0.2},
        PackedCase{"a2a_cp2_padding_causal_dropout", CpCommType::kA2A, 2, "padding_causal",
                   kLengths2, kSlots2, -1, 0.2},
        PackedCase{"a2a_cp2_window", CpCommType::kA2A, 2, "padding_causal", kLengths2, kSlots2, 4},
        // A rank of padding on the fused kernel and a2a; sequences their own slots (no
        // cu_seqlens_padded); dropout drawn in a [sequences, heads, 20, 24] given by max_seqlen.
        PackedCase{
            "p2p_cp2_a_rank_of_padding", CpCommType::kP2P, 2, "padding_causal", {1, 1}, {8, 4}},
        PackedCase{"a2a_cp2_a_rank_of_padding", CpCommType::kA2A, 2, "padding", {1, 1}, {8, 4}},
        PackedCase{"p2p_cp2_no_slots", CpCommType::kP2P, 2, "padding_causal", kSlots2, kSlots2, -1,
                   0, 2, false},
        PackedCase{"all_gather_cp2_max_seqlens_dropout", CpCommType::kAllGather, 2,
                   "padding_causal", kLengths2, kSlots2, -1, 0.2, 2, true, 20, 24},
        PackedCase{"p2p_cp2_max_seqlens_dropout", CpCommType::kP2P, 2, "padding_causal", kLengths2,
                   kSlots2, -1, 0.2, 2, true, 20, 24},
        // a2a+p2p over {ring 2, a2a 2}: each a2a group's tokens of a sequence are its ring
        // chunks of the slot.
        PackedCase{"a2a_p2p_cp4_padding_causal", CpCommType::kA2AP2P, 4, "padding_causal",
                   kLengths4, kSlots4},
        PackedCase{"a2a_p2p_cp4_padding_dropout", CpCommType::kA2AP2P, 4, "padding", kLengths4,
                   kSlots4, -1, 0.2}),
    packed_name);

// A padding mask that broadcasts over the keys ([batch, 1, seqlen, 1]: whole query rows hidden)
// is cut per block as one process broadcasts it.
TEST(ContextParallel, APaddingMaskBroadcastOverTheKeys) {
  const at::Tensor q0 = randn({1, 8, 2, 8}, 7), w = randn({1, 8, 2, 8}, 8);
  const at::Tensor mask = at::arange(8).ge(6).view({1, 1, 8, 1});
  F::AttentionCall call = call_of({"", CpCommType::kP2P, 2, "padding_causal"}, true);
  call.mask = mask;
  at::Tensor q = leaf(q0);
  const at::Tensor ref = F::attention(q, q, q, call);
  (ref * w).sum().backward();
  run_local_ranks(2, [&](int rank) {
    const F::ContextParallel cp(DeviceMesh({2}, {"cp"}), "cp", "p2p");
    at::Tensor ql = leaf(F::cp_shard(q0, 1, 2, cp.rank()));
    const at::Tensor out = F::context_parallel_attention(ql, ql, ql, call, cp);
    (out * F::cp_shard(w, 1, 2, cp.rank())).sum().backward();
    EXPECT_TRUE(Close(out, F::cp_shard(ref, 1, 2, cp.rank()), 1e-5)) << "rank " << rank;
    EXPECT_TRUE(Close(ql.grad(), F::cp_shard(q.grad(), 1, 2, cp.rank()), 1e-5)) << rank;
  });
}

// What each strategy moves over the cp axis for one forward and backward at cp = 4, and a bf16
// ring within bf16's rounding of one process's.
TEST(ContextParallel, TrafficPerStrategyAndBf16) {
  const int64_t batch = 1, seq = 32, heads = 4, d = 8, cp = 4, local = seq / cp;
  const at::Tensor q0 = randn({batch, seq, heads, d}, 5), w = randn({batch, seq, heads, d}, 6);
  const int64_t kv_bytes = 2 * batch * local * heads * d * 4;  // K and V, fp32, one rank's
  run_local_ranks(static_cast<int>(cp), [&](int) {
    const DeviceMesh mesh({cp}, {"cp"});
    for (CpCommType type : {CpCommType::kP2P, CpCommType::kAllGather, CpCommType::kA2A}) {
      const F::ContextParallel c(mesh, "cp", type);
      at::Tensor ql = leaf(F::cp_shard(q0, 1, cp, c.rank()));
      CommTrace trace;
      const at::Tensor out =
          F::context_parallel_attention(ql, ql, ql, call_of({"", type, cp, "causal"}, true), c);
      (out * F::cp_shard(w, 1, cp, c.rank())).sum().backward();
      SCOPED_TRACE(te_name(type));
      if (type == CpCommType::kP2P) {  // K/V on 3 hops each way, dK/dV (fp32) on 4
        EXPECT_EQ(trace.count(Collective::kSendRecv), 3 + 3 + 4);
        EXPECT_EQ(trace.bytes(Collective::kSendRecv), 3 * kv_bytes + 3 * kv_bytes + 4 * kv_bytes);
        EXPECT_EQ(trace.total_count(), trace.count(Collective::kSendRecv));
      } else if (type == CpCommType::kAllGather) {  // K, V gathered twice; dK, dV scattered
        EXPECT_EQ(trace.count(Collective::kAllGather), 4);
        EXPECT_EQ(trace.count(Collective::kReduceScatter), 2);
        EXPECT_EQ(trace.bytes(Collective::kAllGather), 2 * cp * kv_bytes);
      } else {  // q, k, v and the output there; their gradients back
        EXPECT_EQ(trace.count(Collective::kAllToAll), 8);
      }
    }
    const F::ContextParallel ring(mesh, "cp", "p2p");
    const at::Tensor qb = F::cp_shard(q0, 1, cp, ring.rank()).to(at::kBFloat16);
    const at::Tensor one =
        F::attention(q0.to(at::kBFloat16), q0.to(at::kBFloat16), q0.to(at::kBFloat16),
                     call_of({"", CpCommType::kP2P, cp, "causal"}, true));
    const at::Tensor out = F::context_parallel_attention(
        qb, qb, qb, call_of({"", CpCommType::kP2P, cp, "causal"}, true), ring);
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(
        Close(out.to(at::kFloat), F::cp_shard(one, 1, cp, ring.rank()).to(at::kFloat), 1e-2));
  });
}

TEST(ContextParallel, BadInputIsNamed) {
  EXPECT_ERROR(F::ContextParallel(DeviceMesh({1}, {"cp"}), "cp", "ring"),
               "cp_comm_type 'ring' is not one of p2p, all_gather, a2a, a2a+p2p");
  EXPECT_ERROR(F::ContextParallel(DeviceMesh({1}, {"data"}), "cp", "p2p"),
               "mesh axis 'cp' is not in");
  // a2a+p2p takes two axes, the ring's before the a2a's; the others one.
  EXPECT_ERROR(F::ContextParallel(DeviceMesh({1}, {"cp"}), "cp", "a2a+p2p"),
               "splits the sequence over two mesh axes, the ring's (p2p) and the a2a's, major to "
               "minor, but was given 1 ('cp'); map seqlen_cp to two axes");
  EXPECT_ERROR(
      F::ContextParallel(DeviceMesh({1, 1}, {"a", "b"}), std::vector<std::string>{"a", "b"}, "p2p"),
      "splits the sequence over one mesh axis, but was given 2 ('a', 'b')");
  EXPECT_ERROR(F::ContextParallel(DeviceMesh({1, 1}, {"a2a", "ring"}),
                                  std::vector<std::string>{"ring", "a2a"}, "a2a+p2p"),
               "the ring's mesh axis 'ring' must come before the a2a's 'a2a' in the mesh");
  EXPECT_ERROR(F::ContextParallel(DeviceMesh({1, 1}, {"a2a", "ring"}),
                                  std::vector<std::string>{"ring", "ring"}, "a2a+p2p"),
               "the ring and the a2a are both mesh axis 'ring'; give two axes");
  run_local_ranks(4, [](int) {
    const F::ContextParallel both =
        cp_over(cp_mesh(CpCommType::kA2AP2P, 4, 2, false), CpCommType::kA2AP2P);
    const at::Tensor q3 = randn({1, 4, 3, 8}, 1);
    F::AttentionCall call = call_of({"", CpCommType::kA2AP2P, 4, "causal", 3, 0}, true);
    EXPECT_ERROR(F::context_parallel_attention(q3, q3, q3, call, both),
                 "a sliding window (3, 0) is not taken by cp_comm_type 'a2a+p2p'");
    call = call_of({"", CpCommType::kA2AP2P, 4, "causal"}, true);
    EXPECT_ERROR(F::context_parallel_attention(q3, q3, q3, call, both),
                 "over mesh axes 'ring+a2a'): 3 query heads and 3 key/value heads must each divide "
                 "by the a2a axis' size, 2");
    call.softmax_type = SoftmaxType::kOffByOne;
    const at::Tensor q4 = randn({1, 4, 4, 8}, 2);
    EXPECT_ERROR(F::context_parallel_attention(q4, q4, q4, call, both),
                 "softmax_type 'off-by-one' is taken with cp_comm_type 'a2a' only");
  });
  run_local_ranks(2, [](int) {
    const DeviceMesh mesh({2}, {"cp"});
    const F::ContextParallel p2p(mesh, "cp", "p2p"), a2a(mesh, "cp", "a2a");
    const at::Tensor q = randn({1, 4, 3, 8}, 1);
    F::AttentionCall call = call_of({"", CpCommType::kP2P, 2, "causal", 3, 0}, true);
    EXPECT_ERROR(F::context_parallel_attention(q, q, q, call, p2p),
                 "a sliding window (3, 0) is not taken by cp_comm_type 'p2p'");
    call = call_of({"", CpCommType::kP2P, 2, "causal"}, true);
    EXPECT_ERROR(F::context_parallel_attention(q, q, q, call, a2a),
                 "3 query heads and 3 key/value heads must each divide by cp = 2");
    const at::Tensor odd = randn({1, 3, 4, 8}, 2);
    EXPECT_ERROR(F::context_parallel_attention(odd, odd, odd, call, p2p),
                 "each rank holds 3 tokens, an odd number");
    EXPECT_ERROR(F::context_parallel_attention(q, q.narrow(1, 0, 2), q.narrow(1, 0, 2), call, p2p),
                 "q holds 4 tokens but k 2 and v 2");
    call.spec = F::mask_spec("arbitrary");
    call.mask = at::zeros({1, 3, 8, 8}, at::kBool);
    EXPECT_ERROR(F::context_parallel_attention(q, q, q, call, p2p),
                 "attn_mask_type 'arbitrary' is not taken with context parallelism");
    call = call_of({"", CpCommType::kP2P, 2, "causal"}, true);
    call.softcap = -1.0;
    EXPECT_ERROR(F::context_parallel_attention(q, q, q, call, p2p),
                 "softcap -1 must be a finite number >= 0");
    call.softcap = 0.0;
    EXPECT_ERROR(F::context_parallel_attention(q, q.narrow(3, 0, 4), q.narrow(3, 0, 4), call, p2p),
                 "with h a multiple of hkv");
    // A padding mask is the whole sequence's (8 tokens), one for every head.
    call.spec = F::mask_spec("padding_causal");
    call.mask = at::zeros({1, 1, 4, 4}, at::kBool);
    EXPECT_ERROR(F::context_parallel_attention(q, q, q, call, p2p),
                 "does not broadcast to the logits [batch 1, heads 3, seqlen_q 8, seqlen_kv 8]");
    call.mask = at::zeros({1, 3, 8, 8}, at::kBool);
    EXPECT_ERROR(F::context_parallel_attention(q, q, q, call, p2p),
                 "the padding mask of attn_mask_type 'padding_causal' has 3 heads");
    call = call_of({"", CpCommType::kP2P, 2, "causal"}, true);
    call.softmax_type = SoftmaxType::kLearnable;
    call.softmax_offset = at::zeros({4});
    const at::Tensor q4 = randn({1, 4, 4, 8}, 3);
    EXPECT_ERROR(F::context_parallel_attention(q4, q4, q4, call, a2a),
                 "softmax_type 'learnable' (sink logits per head, which a2a would split");
    // Packed sequences: TE's layout and one set of sequences.
    const at::Tensor packed_q = randn({6, 4, 8}, 4);
    F::AttentionCall packed = call_of({"", CpCommType::kP2P, 2, "padding_causal"}, true);
    packed.packed.cu_seqlens_q = packed.packed.cu_seqlens_kv = at::tensor({0, 5, 9}, at::kLong);
    packed.packed.cu_seqlens_q_padded = packed.packed.cu_seqlens_kv_padded =
        at::tensor({0, 6, 12}, at::kLong);
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "sequence 0 has a slot of 6 tokens (cu_seqlens_padded[0..1]); pad each sequence "
                 "to a multiple of 4");
    packed.packed.cu_seqlens_q_padded = packed.packed.cu_seqlens_kv_padded =
        at::tensor({0, 8, 12}, at::kLong);
    packed.packed.cu_seqlens_kv = at::tensor({0, 4, 9}, at::kLong);
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "cu_seqlens_q and cu_seqlens_kv (and their _padded) must be the same");
    packed.packed.cu_seqlens_kv = packed.packed.cu_seqlens_q;
    EXPECT_ERROR(F::context_parallel_attention(packed_q.narrow(0, 0, 4), packed_q.narrow(0, 0, 4),
                                               packed_q.narrow(0, 0, 4), packed, p2p),
                 "each rank holds 4 tokens, so the whole packed tensor has cp · 4 = 8, but "
                 "cu_seqlens_q_padded ends at 12");
    packed.packed.cu_seqlens_q = packed.packed.cu_seqlens_kv = at::tensor({0, 5, 12}, at::kLong);
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "sequence 1 of cu_seqlens_q is longer than its slot in cu_seqlens_q_padded");
    packed.packed.cu_seqlens_q = packed.packed.cu_seqlens_kv = at::tensor({0, 5, 9}, at::kLong);
    packed.packed.cu_seqlens_q_padded = packed.packed.cu_seqlens_kv_padded =
        at::tensor({0, 12}, at::kLong);
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "cu_seqlens_q_padded has 2 entries but cu_seqlens_q has 3");
    packed.packed.cu_seqlens_q_padded = packed.packed.cu_seqlens_kv_padded =
        at::tensor({0, 8, 12}, at::kLong);
    packed.packed.max_seqlen_kv = 4;
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "max_seqlen_kv 4 is shorter than the longest sequence (5 tokens)");
    packed.packed.max_seqlen_kv = 0;
    packed.spec = F::mask_spec("causal");
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "qkv_format 'thd' takes a padding mask type and no mask");
    packed.spec = F::mask_spec("padding_causal", WindowSize{2, 0});
    EXPECT_ERROR(F::context_parallel_attention(packed_q, packed_q, packed_q, packed, p2p),
                 "a sliding window (2, 0) is not taken by cp_comm_type 'p2p'");
    call = call_of({"", CpCommType::kP2P, 2, "causal"}, true);
    EXPECT_ERROR(F::context_parallel_attention(q.to(at::kDouble), q.to(at::kDouble),
                                               q.to(at::kDouble), call, p2p),
                 "runs te's fused CPU kernel, which takes float32, bfloat16 or float16");
  });
}

}  // namespace
}  // namespace te::nn

namespace te::nn {
namespace {

// MultiHeadAttention (GQA, causal, RoPE) with its sequence split over a cp axis by TE's table
// (MeshResource cp, which maps seqlen_cp) beside data- and tensor-parallel axes, and over four
// ranks: outputs and the input's gradient equal one process's, for each cp_comm_type.
TEST(ContextParallelLayers, MultiHeadAttentionOnCpLayoutsIsOneProcess) {
  const at::Tensor x0 = test::randn({2, 16, 32}, 21), w = test::randn({2, 16, 32}, 22);
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(8));
  const auto options = [](std::optional<CpCommType> type) {
    auto o = MultiHeadAttentionOptions(32, 4);
    o.attention().num_gqa_groups(2).attn_mask_type("causal");
    if (type) o.attention().cp_comm_type(*type);
    return o;
  };
  const AttentionArgs args = AttentionArgs().rotary_pos_emb(rope->forward(16));
  manual_seed(23);
  MultiHeadAttention one(options(std::nullopt));
  at::Tensor x_ref = test::leaf(x0);
  const at::Tensor want = one(x_ref, {}, {}, args);
  (want * w).sum().backward();
  struct Layout {
    std::vector<int64_t> shape;
    std::vector<std::string> names;
    std::string resource, rules;
  };
  // (a2a+p2p: the sequence over two axes, which a rule names; TE's table maps cp to one)
  for (const Layout& l :
       {Layout{{2}, {"cp"}, "cp=cp"}, Layout{{2, 2}, {"data", "cp"}, "dp=data,cp=cp"},
        Layout{{2, 2}, {"cp", "tp"}, "cp=cp,tp=tp"}, Layout{{4}, {"cp"}, "cp=cp"},
        Layout{{2, 2}, {"ring", "a2a"}, "", "seqlen_cp=(ring,a2a)"}}) {
    for (CpCommType type :
         {CpCommType::kP2P, CpCommType::kAllGather, CpCommType::kA2A, CpCommType::kA2AP2P}) {
      const bool hierarchical = type == CpCommType::kA2AP2P;
      if (hierarchical != !l.rules.empty()) continue;
      const int64_t cp = l.names[0] == "cp" ? l.shape[0] : l.shape[1];
      const int64_t tp = l.names.size() == 2 && l.names[1] == "tp" ? 2 : 1;
      if (type == CpCommType::kA2A && (2 / tp) % cp != 0) continue;  // a2a splits the kv heads
      SCOPED_TRACE(::testing::Message() << l.resource << l.rules << " " << te_name(type));
      run_local_ranks(
          static_cast<int>(l.shape[0] * (l.shape.size() > 1 ? l.shape[1] : 1)), [&](int rank) {
            DeviceMesh mesh(l.shape, l.names);
            MeshScope scope(mesh);
            MeshResourceScope resource(l.resource.empty() ? MeshResource{}
                                                          : parse_mesh_resource(l.resource));
            std::optional<AxisRulesScope> rules;
            if (!l.rules.empty()) rules.emplace(parse_axis_rules(l.rules));
            manual_seed(23);
            MultiHeadAttention mha(options(type));
            at::Tensor x = test::leaf(x0);
            CommTrace trace;
            const at::Tensor y =
                mha(DTensor::distribute(x, mesh,
                                        std::vector<Placement>(l.shape.size(), Replicate{})),
                    std::nullopt, {}, args)
                    .full_tensor();
            EXPECT_TRUE(Close(y, want, 1e-5)) << "rank " << rank;
            (y * w).sum().backward();
            EXPECT_TRUE(Close(x.grad(), x_ref.grad(), 1e-5)) << "dx, rank " << rank;
            if (hierarchical) {  // the a2a over its axis, the ring over the other
              EXPECT_GT(trace.count(Collective::kAllToAll, "a2a"), 0);
              EXPECT_GT(trace.count(Collective::kSendRecv, "ring"), 0);
              return;
            }
            const Collective moves = type == CpCommType::kP2P         ? Collective::kSendRecv
                                     : type == CpCommType::kAllGather ? Collective::kReduceScatter
                                                                      : Collective::kAllToAll;
            EXPECT_GT(trace.count(moves, "cp"), 0) << "attention ran without context parallelism";
          });
    }
  }
}

// Packed tokens [tokens, hidden] (1-D cu_seqlens) in TE's layout through MultiHeadAttention (GQA,
// RoPE per sequence, attention dropout) and TransformerLayer on CP2 with each strategy: outputs
// and the input's gradient equal one process's.
TEST(ContextParallelLayers, PackedTokensThroughTheLayersAreOneProcess) {
  const at::Tensor cu = cumulative(kLengths2), slots = cumulative(kSlots2);
  const int64_t tokens = slots[-1].item<int64_t>();
  const at::Tensor x0 = randn({tokens, 32}, 41), w = randn({tokens, 32}, 42);
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(8));
  const AttentionArgs args = AttentionArgs()
                                 .cu_seqlens_q(cu)
                                 .cu_seqlens_kv(cu)
                                 .cu_seqlens_q_padded(slots)
                                 .cu_seqlens_kv_padded(slots)
                                 .rotary_pos_emb(rope->forward(tokens));
  const auto mha_options = [](std::optional<CpCommType> type) {
    auto o = MultiHeadAttentionOptions(32, 4);
    o.attention().num_gqa_groups(2).attn_mask_type("padding_causal").qkv_format("thd");
    o.attention().attention_dropout(0.2);
    if (type) o.attention().cp_comm_type(*type);
    return o;
  };
  const auto layer_options = [](std::optional<CpCommType> type) {
    auto o = TransformerLayerOptions(32, 64, 4).hidden_dropout(0.0).intermediate_dropout(0.0);
    o.self_attention().attention().attn_mask_type("padding").qkv_format("thd");
    if (type) o.self_attention().attention().cp_comm_type(*type);
    return o;
  };
  for (const bool layer : {false, true}) {
    const auto run = [&](std::optional<CpCommType> type, const auto& x) {
      manual_seed(43);
      if (layer) return TransformerLayer(layer_options(type))(x, {}, {}, {}, args);
      return MultiHeadAttention(mha_options(type))(x, {}, {}, args);
    };
    at::Tensor x_ref = leaf(x0);
    const at::Tensor want = run(std::nullopt, x_ref);
    (want * w).sum().backward();
    for (CpCommType type : {CpCommType::kP2P, CpCommType::kAllGather, CpCommType::kA2A}) {
      SCOPED_TRACE(::testing::Message() << (layer ? "layer " : "mha ") << te_name(type));
      run_local_ranks(2, [&](int rank) {
        DeviceMesh mesh({2}, {"cp"});
        MeshScope scope(mesh);
        MeshResourceScope resource(parse_mesh_resource("cp=cp"));
        const auto mine = [&](const at::Tensor& t) {
          return F::cp_shard_packed(t, 0, slots, 2, rank);
        };
        at::Tensor x = leaf(mine(x0));
        const DTensor y =
            run(type, DTensor::from_local(x, mesh, {Shard{0}}, std::vector<int64_t>{tokens, 32}));
        // (the whole output in rank order, back to the sequences' own)
        const at::Tensor whole = F::cp_unshard_packed(y.full_tensor(), 0, slots, 2);
        EXPECT_TRUE(Close(whole, want.detach(), 1e-5)) << "rank " << rank;
        (whole * w).sum().backward();
        EXPECT_TRUE(Close(x.grad(), mine(x_ref.grad()), 1e-5)) << "dx, rank " << rank;
      });
    }
  }
}

TEST(ContextParallelLayers, CpCommTypeWithoutACpAxisIsNamed) {
  EXPECT_ERROR(DotProductAttention(DotProductAttentionOptions(4, 8).cp_load_balanced(true)),
               "cp_load_balanced is set without cp_comm_type");
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("dp=data"));
    auto o = MultiHeadAttentionOptions(32, 4);
    o.attention().cp_comm_type("p2p");
    MultiHeadAttention mha(o);
    EXPECT_ERROR(mha(DTensor::distribute(test::randn({2, 8, 32}, 1), mesh, {Replicate{}})),
                 "cp_comm_type 'p2p' is set, but q DTensor");
    EXPECT_ERROR(mha(DTensor::distribute(test::randn({2, 8, 32}, 1), mesh, {Replicate{}})),
                 "map the logical axis 'seqlen_cp' to a mesh axis in the rules (or MeshResource "
                 "cp), or unset cp_comm_type");
  });
  // a2a+p2p takes the sequence over two axes, the others over one.
  run_local_ranks(4, [](int) {
    DeviceMesh mesh({2, 2}, {"ring", "a2a"});
    MeshScope scope(mesh);
    for (const auto& [type, rules, what] :
         std::vector<std::tuple<const char*, const char*, const char*>>{
             {"a2a+p2p", "seqlen_cp=ring",
              "cp_comm_type 'a2a+p2p') splits the sequence over two mesh axes, the ring's (p2p) "
              "and the a2a's, major to minor, but was given 1 ('ring'); map seqlen_cp to two "
              "axes"},
             {"p2p", "seqlen_cp=(ring,a2a)",
              "(cp_comm_type 'p2p') splits the sequence over one mesh axis, but was given 2 "
              "('ring', 'a2a')"}}) {
      AxisRulesScope scope_rules(parse_axis_rules(rules));
      auto o = MultiHeadAttentionOptions(32, 4);
      o.attention().cp_comm_type(type);
      MultiHeadAttention mha(o);
      EXPECT_ERROR(
          mha(DTensor::distribute(test::randn({2, 8, 32}, 1), mesh, {Replicate{}, Replicate{}})),
          what);
    }
  });
}

}  // namespace
}  // namespace te::nn

namespace te::nn {
namespace {

// Every FP8 recipe with the whole layer's activations split over the cp axis (rules
// seqlen=cp,seqlen_cp=cp: the projections' GEMMs take each rank's tokens, attention the whole
// sequence): MultiHeadAttention's output, input gradient and weight gradients equal one
// process's under the same recipe (per-tensor amaxes reduced over the mesh; 128 tokens per rank,
// so every shard boundary falls between blocks), within 2e-3 of each tensor's largest magnitude:
// the room a few FP8 codes flipped by one-ulp differences take (the merged attention output
// differs from one process's by fp32 rounding, and the output projection casts it; measured: up
// to 3.2e-4 of the largest magnitude, in the layer norm's and kv kernel's gradients).
TEST(ContextParallelLayers, EveryFp8RecipeOnCp2IsOneProcess) {
  const std::vector<int64_t> shape = {1, 256, 128};
  const at::Tensor x0 = randn(shape, 31), w = randn(shape, 32) * 0.1;
  const auto build = [](std::optional<CpCommType> type) {
    manual_seed(33);
    auto o = MultiHeadAttentionOptions(128, 4);
    o.attention().num_gqa_groups(2).attn_mask_type("causal").attention_dropout(0.0);
    if (type) o.attention().cp_comm_type(*type);
    return MultiHeadAttention(o);
  };
  const double flips = 2e-3;
  for (const fp8::Recipe& recipe : test::every_fp8_recipe()) {
    const auto close = [flips](const at::Tensor& got,
                               const at::Tensor& want) -> ::testing::AssertionResult {
      const double top = want.abs().max().item<double>();
      if (at::allclose(got, want, 1e-5, std::max(1e-6 * top, flips * top) + 1e-7)) {
        return ::testing::AssertionSuccess();
      }
      return ::testing::AssertionFailure()
             << "max err " << (got - want).abs().max().item<double>() << " of " << top;
    };
    MultiHeadAttention one = build(std::nullopt);
    at::Tensor x_ref = leaf(x0);
    at::Tensor want;
    {
      Fp8Autocast fp8(true, recipe);
      want = one(x_ref);
      (want * w).sum().backward();
    }
    for (CpCommType type : {CpCommType::kP2P, CpCommType::kA2A}) {
      run_local_ranks(2, [&](int rank) {
        DeviceMesh mesh({2}, {"cp"});
        MeshScope scope(mesh);
        AxisRulesScope rules(parse_axis_rules("seqlen=cp,seqlen_cp=cp"));
        MultiHeadAttention mha = build(type);
        const at::Tensor x = leaf(x0.narrow(1, rank * 128, 128));
        at::Tensor y;
        {
          Fp8Autocast fp8(true, recipe);
          y = mha(DTensor::from_local(x, mesh, {Shard{1}}, shape), std::nullopt).full_tensor();
          (y * w).sum().backward();
        }
        const std::string where =
            fp8::to_string(recipe) + " " + te_name(type) + ", rank " + std::to_string(rank);
        EXPECT_TRUE(close(y, want.detach())) << "output, " << where;
        EXPECT_TRUE(close(x.grad(), x_ref.grad().narrow(1, rank * 128, 128))) << "dx, " << where;
        const auto theirs = one->named_parameters();
        for (const auto& p : mha->named_parameters()) {
          ASSERT_TRUE(p.value().grad().defined()) << p.key();
          EXPECT_TRUE(close(p.value().grad(), theirs[p.key()].grad())) << p.key() << ", " << where;
        }
      });
    }
  }
}

}  // namespace
}  // namespace te::nn
