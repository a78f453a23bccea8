// te::train's token file and batches: written once and reused, another tokenizer refused; blocks,
// packed THD rows that never mix documents, the chat loss mask in the labels, the seeded order
// resumed from its JSON, data-parallel shares, the held-out split, and the options' errors.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <set>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "te/train/data.h"
#include "train_fixtures.h"

namespace {

using te::train::Batch;
using te::train::DataLoader;
using te::train::DataOptions;
using te::train::TokenFile;
using te::train::TokenFileOptions;

TokenFileOptions quiet(int64_t eos = 0) {
  TokenFileOptions o;
  o.eos_id = eos;
  o.progress = false;
  return o;
}

// Documents of 1 to ~60 tokens, some long enough to be cut into pieces at seq_len 16.
std::string corpus(int documents) {
  std::string text;
  for (int d = 0; d < documents; ++d) {
    text += "Document " + std::to_string(d) + " says";
    for (int w = 0; w < (d * 7) % 23; ++w) text += " the word " + std::to_string(w);
    text += ".\n\n";
  }
  return text;
}

std::vector<int64_t> all_documents(const TokenFile& f) {
  std::vector<int64_t> d(static_cast<size_t>(f.num_documents()));
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<int64_t>(i);
  return d;
}

DataOptions options(int64_t seq_len, int64_t batch, bool packed) {
  DataOptions o;
  o.seq_len = seq_len;
  o.batch_size = batch;
  o.packed = packed;
  o.seed = 7;
  return o;
}

void expect_same(const Batch& a, const Batch& b) {
  EXPECT_TRUE(at::equal(a.ids, b.ids));
  EXPECT_TRUE(at::equal(a.labels, b.labels));
  EXPECT_TRUE(at::equal(a.position_ids, b.position_ids));
  ASSERT_EQ(a.cu_seqlens.size(), b.cu_seqlens.size());
  for (size_t r = 0; r < a.cu_seqlens.size(); ++r)
    EXPECT_TRUE(at::equal(a.cu_seqlens[r], b.cu_seqlens[r]));
  EXPECT_EQ(a.label_tokens, b.label_tokens);
}

class TrainData : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (dir_ / "corpus.txt").string();
    te::test::write_file(path_, corpus(40));
  }
  TokenFile file() { return TokenFile::open_or_build(path_, te::test::bpe_tokenizer(), quiet()); }
  te::test::TempDir dir_{"te_train"};
  std::string path_;
};

TEST_F(TrainData, TokenFileIsWrittenOnceReusedAndRebuiltWhenTheSourceChanges) {
  const TokenFile first = file();
  EXPECT_TRUE(first.built());
  EXPECT_EQ(first.path(), path_ + ".tokens");
  EXPECT_EQ(first.num_documents(), 40);
  EXPECT_EQ(first.loss_mask(), nullptr);
  const auto& tok = te::test::bpe_tokenizer();
  const auto doc3 =
      te::train::tokenize_text(tok, te::train::read_source(path_).documents[3].text, 0);
  const int64_t* off = first.document_offsets();
  ASSERT_EQ(off[4] - off[3], static_cast<int64_t>(doc3.ids.size()));
  for (size_t i = 0; i < doc3.ids.size(); ++i) EXPECT_EQ(first.tokens()[off[3] + i], doc3.ids[i]);
  EXPECT_EQ(off[40], first.num_tokens());
  const TokenFile again = file();
  EXPECT_FALSE(again.built());
  EXPECT_EQ(again.num_tokens(), first.num_tokens());
  te::test::write_file(path_, corpus(12));
  const TokenFile rebuilt = file();
  EXPECT_TRUE(rebuilt.built());
  EXPECT_EQ(rebuilt.num_documents(), 12);
  TokenFileOptions other_eos = quiet(2);
  EXPECT_TRUE(TokenFile::open_or_build(path_, tok, other_eos).built());
  EXPECT_EQ(TokenFile::open(path_ + ".tokens").num_documents(), 12);
}

TEST_F(TrainData, TokenFileOfAnotherTokenizerIsAnErrorNamingIt) {
  file();
  std::ifstream in(te::test::bpe_tokenizer_path());
  nlohmann::json json = nlohmann::json::parse(in);
  json["model"]["merges"].erase(json["model"]["merges"].begin());
  const auto other = te::hf::Tokenizer::from_json(json.dump(), "other.json");
  EXPECT_ERROR(TokenFile::open_or_build(path_, other, quiet()),
               "corpus.txt.tokens: this token file was made with another tokenizer");
  te::test::write_file((dir_ / "junk.tokens").string(), std::string(100, 'x'));
  EXPECT_ERROR(TokenFile::open((dir_ / "junk.tokens").string()), "not a te-train token file");
  EXPECT_ERROR(TokenFile::open_or_build((dir_ / "none.txt").string(), other, quiet()),
               "none.txt: cannot open the data file");
  EXPECT_ERROR(TokenFile::open_or_build(path_, other, quiet(1 << 20)), "eos id 1048576");
}

TEST_F(TrainData, BlocksAreTheDocumentStreamShiftedByOne) {
  const TokenFile f = file();
  DataOptions o = options(16, 2, false);
  o.shuffle = false;
  DataLoader loader(f, all_documents(f), o);
  EXPECT_EQ(loader.num_units(), (f.num_tokens() - 1) / 16);
  const Batch b = loader.batch({0, 1});  // blocks 2 and 3
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t at = (2 + r) * 16 + t;
      EXPECT_EQ(b.ids[r][t].item<int64_t>(), f.tokens()[at]);
      EXPECT_EQ(b.labels[r][t].item<int64_t>(), f.tokens()[at + 1]);
      EXPECT_EQ(b.position_ids[r][t].item<int64_t>(), t);
    }
  }
  EXPECT_EQ(b.label_tokens, 32);
  EXPECT_TRUE(b.cu_seqlens.empty());
}

// Blocks of a subset of the documents (a held-out split's, the training rest) are that subset's
// stream, labels one token on: across the gaps between its documents too.
TEST_F(TrainData, BlocksOfSomeDocumentsAreTheirStreamShiftedByOne) {
  const TokenFile f = file();
  std::vector<int64_t> docs, stream;
  for (int64_t d = 0; d < f.num_documents(); d += 3) {
    docs.push_back(d);
    for (int64_t t = f.document_offsets()[d]; t < f.document_offsets()[d + 1]; ++t) {
      stream.push_back(f.tokens()[t]);
    }
  }
  DataOptions o = options(16, 2, false);
  o.shuffle = false;
  DataLoader loader(f, docs, o);
  ASSERT_GE(loader.steps_per_epoch(), 2);
  for (int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    const Batch b = loader.batch({0, step});
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t t = 0; t < 16; ++t) {
        const auto at = static_cast<size_t>((step * 2 + r) * 16 + t);
        ASSERT_EQ(b.ids[r][t].item<int64_t>(), stream[at]) << step << " " << r << " " << t;
        ASSERT_EQ(b.labels[r][t].item<int64_t>(), stream[at + 1]) << step << " " << r << " " << t;
      }
    }
  }
}

// Every sequence of a packed row is a piece of one document: positions 0.. from its start, each
// label the next token of that document (-100 after its last), the padding a last sequence.
TEST_F(TrainData, PackedRowsNeverMixDocumentsAndRestartPositions) {
  const TokenFile f = file();
  DataLoader loader(f, all_documents(f), options(16, 4, true));
  std::multiset<int64_t> seen;
  const int64_t* off = f.document_offsets();
  int64_t pieces = 0;
  for (int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    const Batch b = loader.batch({0, step});
    for (int64_t r = 0; r < 4; ++r) {
      const at::Tensor cu = b.cu_seqlens[r];
      EXPECT_EQ(cu[0].item<int>(), 0);
      EXPECT_EQ(cu[-1].item<int>(), 16);
      for (int64_t s = 0; s + 1 < cu.size(0); ++s) {
        const int64_t begin = cu[s].item<int>(), end = cu[s + 1].item<int>();
        const auto ids = b.ids[r].slice(0, begin, end), labels = b.labels[r].slice(0, begin, end);
        // Find the piece in the file: the document whose tokens it is.
        const bool padding = labels.eq(-100).all().item<bool>() && end == 16 && begin > 0 &&
                             ids.eq(0).all().item<bool>() && labels.numel() > 1;
        for (int64_t t = begin; t < end; ++t)
          EXPECT_EQ(b.position_ids[r][t].item<int64_t>(), t - begin);
        if (padding) continue;
        for (int64_t t = 0; t + 1 < end - begin; ++t)
          EXPECT_EQ(labels[t].item<int64_t>(), ids[t + 1].item<int64_t>());
        const int64_t last_label = labels[-1].item<int64_t>();
        const int64_t eos_last = ids[-1].item<int64_t>() == 0;
        EXPECT_TRUE(eos_last ? last_label == -100 : last_label >= 0) << "row " << r << " seq " << s;
        if (!eos_last) ++pieces;  // a piece of a document cut at 16 tokens
        seen.insert(end - begin);
      }
    }
  }
  EXPECT_GT(pieces, 0);
  int64_t longest = 0;
  for (int64_t d = 0; d < f.num_documents(); ++d) longest = std::max(longest, off[d + 1] - off[d]);
  EXPECT_GT(longest, 16);
}

// pack_align (context parallelism's 2·cp): each sequence's slot a multiple of it, its valid
// tokens first (cu_seqlens the valid lengths' sums, TE's), the padding after it ids pad_id,
// labels -100 and positions going on; the documents' tokens and labels those of rows without
// alignment, in the same order; a data position of another alignment is refused.
TEST_F(TrainData, PackedSlotsAlignedForContextParallelism) {
  const TokenFile f = file();
  DataOptions aligned = options(32, 2, true);
  aligned.pack_align = 8;
  aligned.shuffle = false;
  DataOptions plain = aligned;
  plain.pack_align = 1;
  DataLoader a(f, all_documents(f), aligned), p(f, all_documents(f), plain);
  std::vector<int64_t> tokens_a, labels_a, tokens_p, labels_p;
  for (int64_t step = 0; step < a.steps_per_epoch(); ++step) {
    const Batch b = a.batch({0, step});
    ASSERT_EQ(b.cu_seqlens_padded.size(), 2u);
    for (int64_t r = 0; r < 2; ++r) {
      const at::Tensor cu = b.cu_seqlens[r].to(at::kLong),
                       slots = b.cu_seqlens_padded[r].to(at::kLong);
      ASSERT_EQ(cu.sizes(), slots.sizes());
      EXPECT_EQ(slots[-1].item<int64_t>(), 32);
      for (int64_t s = 0; s + 1 < cu.size(0); ++s) {
        const int64_t start = slots[s].item<int64_t>(), slot = slots[s + 1].item<int64_t>() - start;
        const int64_t len = cu[s + 1].item<int64_t>() - cu[s].item<int64_t>();
        EXPECT_EQ(slot % 8, 0) << "row " << r << " seq " << s;
        ASSERT_LE(len, slot);
        EXPECT_GT(len + 8, slot);  // less than one multiple of padding
        for (int64_t t = 0; t < slot; ++t) {
          EXPECT_EQ(b.position_ids[r][start + t].item<int64_t>(), t);
          if (t >= len) {
            EXPECT_EQ(b.labels[r][start + t].item<int64_t>(), -100);
            EXPECT_EQ(b.ids[r][start + t].item<int64_t>(), 0);
          }
        }
        const bool row_padding =
            s + 2 == cu.size(0) && b.labels[r].narrow(0, start, len).eq(-100).all().item<bool>();
        for (int64_t t = 0; t < len && !row_padding; ++t) {
          tokens_a.push_back(b.ids[r][start + t].item<int64_t>());
          labels_a.push_back(b.labels[r][start + t].item<int64_t>());
        }
      }
    }
  }
  for (int64_t step = 0; step < p.steps_per_epoch(); ++step) {
    const Batch b = p.batch({0, step});
    EXPECT_TRUE(b.cu_seqlens_padded.empty());
    for (int64_t r = 0; r < 2; ++r) {
      const at::Tensor labels = b.labels[r], ids = b.ids[r];
      const at::Tensor cu = b.cu_seqlens[r].to(at::kLong);
      for (int64_t s = 0; s + 1 < cu.size(0); ++s) {
        const int64_t begin = cu[s].item<int64_t>(), end = cu[s + 1].item<int64_t>();
        if (s + 2 == cu.size(0) && labels.slice(0, begin, end).eq(-100).all().item<bool>())
          continue;
        for (int64_t t = begin; t < end; ++t) {
          tokens_p.push_back(ids[t].item<int64_t>());
          labels_p.push_back(labels[t].item<int64_t>());
        }
      }
    }
  }
  // (the aligned rows hold fewer documents each: compare what both epochs hold)
  const std::size_t n = std::min(tokens_a.size(), tokens_p.size());
  ASSERT_GT(n, 100u);
  EXPECT_EQ(std::vector<int64_t>(tokens_a.begin(), tokens_a.begin() + n),
            std::vector<int64_t>(tokens_p.begin(), tokens_p.begin() + n));
  EXPECT_EQ(std::vector<int64_t>(labels_a.begin(), labels_a.begin() + n),
            std::vector<int64_t>(labels_p.begin(), labels_p.begin() + n));
  EXPECT_ERROR(p.load_state_json(a.state_json()),
               "the data position was saved with pack_align 8, this run has 1");
  // Blocks have no slots: their position loads whatever alignment it was saved with.
  DataOptions blocks = options(32, 2, false);
  blocks.pack_align = 4;
  const DataLoader saved(f, all_documents(f), blocks);
  blocks.pack_align = 1;
  DataLoader resumed(f, all_documents(f), blocks);
  resumed.load_state_json(saved.state_json());
  DataOptions bad = aligned;
  bad.seq_len = 36;
  EXPECT_ERROR(DataLoader(f, all_documents(f), bad),
               "pack_align 8: each packed sequence's slot is a multiple of it, and so must "
               "seq_len 36 be");
}

TEST_F(TrainData, ResumingFromTheSavedPositionGivesTheSameBatches) {
  for (bool packed : {false, true}) {
    const TokenFile f = file();
    DataLoader run(f, all_documents(f), options(16, 2, packed));
    const int64_t steps = run.steps_per_epoch() + 3;  // across an epoch's end
    std::vector<Batch> uninterrupted;
    std::string saved;
    for (int64_t s = 0; s < steps; ++s) {
      if (s == steps - 5) saved = run.state_json();
      uninterrupted.push_back(run.next());
    }
    DataLoader resumed(f, all_documents(f), options(16, 2, packed));
    resumed.load_state_json(saved);
    for (int64_t s = steps - 5; s < steps; ++s) expect_same(resumed.next(), uninterrupted[s]);
    EXPECT_EQ(resumed.position(), run.position());
    EXPECT_EQ(run.position().epoch, 1);
    EXPECT_FALSE(at::equal(uninterrupted[0].ids, run.batch({1, 0}).ids));  // reshuffled
    DataLoader other(f, all_documents(f), options(8, 2, packed));
    EXPECT_ERROR(other.load_state_json(saved), "saved with seq_len 16, this run has 8");
    EXPECT_ERROR(other.load_state_json("{\"epoch\": 0}"), "has no \"seq_len\"");
    EXPECT_ERROR(other.load_state_json("nope"), "not JSON");
  }
}

TEST_F(TrainData, DataParallelRanksTakeTheirSliceOfEachGlobalBatch) {
  const TokenFile f = file();
  DataLoader whole(f, all_documents(f), options(16, 4, true));
  for (int64_t rank = 0; rank < 2; ++rank) {
    DataOptions o = options(16, 2, true);
    o.dp_rank = rank;
    o.dp_size = 2;
    DataLoader part(f, all_documents(f), o);
    EXPECT_EQ(part.steps_per_epoch(), whole.steps_per_epoch());
    for (int64_t step : {0, 3}) {
      const Batch mine = part.batch({1, step}), all = whole.batch({1, step});
      EXPECT_TRUE(at::equal(mine.ids, all.ids.slice(0, 2 * rank, 2 * rank + 2)));
      EXPECT_TRUE(at::equal(mine.cu_seqlens[1], all.cu_seqlens[2 * rank + 1]));
    }
  }
}

TEST_F(TrainData, ChatLabelsCountOnlyAssistantTokens) {
  const std::string chat = (dir_ / "chat.jsonl").string();
  std::string lines;
  for (int i = 0; i < 6; ++i)
    lines += "{\"messages\": [{\"role\": \"user\", \"content\": \"Question " + std::to_string(i) +
             "\"}, {\"role\": \"assistant\", \"content\": \"Answer " + std::to_string(i) +
             "\"}]}\n";
  te::test::write_file(chat, lines);
  TokenFileOptions o = quiet();
  EXPECT_ERROR(TokenFile::open_or_build(chat, te::test::bpe_tokenizer(), o),
               "chat.jsonl: chat data needs the model's chat template");
  o.chat_template = te::test::chatml_template();
  const TokenFile f = TokenFile::open_or_build(chat, te::test::bpe_tokenizer(), o);
  ASSERT_NE(f.loss_mask(), nullptr);
  DataOptions d = options(64, 1, true);
  d.shuffle = false;
  DataLoader loader(f, all_documents(f), d);
  const Batch b = loader.batch({0, 0});
  const auto& tok = te::test::bpe_tokenizer();
  std::vector<int64_t> targets;
  for (int64_t t = 0; t < 64; ++t)
    if (b.labels[0][t].item<int64_t>() != -100) targets.push_back(b.labels[0][t].item<int64_t>());
  EXPECT_EQ(tok.decode(targets, false), "Answer 0<|im_end|>");
  EXPECT_EQ(b.label_tokens, static_cast<int64_t>(targets.size()));
}

TEST_F(TrainData, HeldOutSplitIsSeededAndDisjoint) {
  const auto a = te::train::split_documents(100, 0.1, 0, 3);
  EXPECT_EQ(a.eval.size(), 10u);
  EXPECT_EQ(a.train.size(), 90u);
  EXPECT_EQ(te::train::split_documents(100, 0.1, 0, 3).eval, a.eval);
  EXPECT_NE(te::train::split_documents(100, 0.1, 0, 4).eval, a.eval);
  EXPECT_EQ(te::train::split_documents(100, 0.001, 0, 3).eval.size(), 1u);
  EXPECT_EQ(te::train::split_documents(100, 0.0, 5, 3).eval.size(), 5u);
  EXPECT_ERROR(te::train::split_documents(10, 1.0, 0, 0), "eval fraction 1 is outside [0, 1)");
  EXPECT_ERROR(te::train::split_documents(10, -0.5, 0, 0), "eval fraction -0.5");
  EXPECT_ERROR(te::train::split_documents(10, 0.0, 10, 0), "leaves none for training");

  te::train::DataSpec spec;
  spec.train_path = path_;
  spec.eval_count = 4;
  spec.tokens = quiet();
  spec.batches = options(8, 2, true);
  te::train::Data data = te::train::open_data(spec, te::test::bpe_tokenizer());
  ASSERT_TRUE(data.eval.has_value());
  EXPECT_FALSE(data.eval->options().shuffle);
  expect_same(data.eval->batch({0, 0}), data.eval->batch({0, 0}));
}

TEST_F(TrainData, BadOptionsAndTooLittleDataAreErrors) {
  const TokenFile f = file();
  EXPECT_ERROR(DataLoader(f, all_documents(f), options(0, 1, false)), "seq_len 0 is below 1");
  EXPECT_ERROR(DataLoader(f, all_documents(f), options(100000, 1, false)),
               "shorter than one block of seq_len + 1 = 100001");
  EXPECT_ERROR(DataLoader(f, all_documents(f), options(16, 100000, true)),
               "fewer than one global batch of 100000");
  DataOptions rank = options(16, 1, false);
  rank.dp_rank = 2;
  rank.dp_size = 2;
  EXPECT_ERROR(DataLoader(f, all_documents(f), rank), "data-parallel rank 2 of 2");
  DataLoader loader(f, all_documents(f), options(16, 1, false));
  EXPECT_ERROR(loader.seek({0, loader.steps_per_epoch()}), "is outside the");
}

}  // namespace
