// te::hf's BERT encoder and tokenizer: config.json read strictly, a saved encoder loading back on
// one process and on two tensor-parallel ranks (with and without BertFor*'s "bert." prefix and
// the pooler), the WordPiece pipeline on a small vocabulary, and every bad input named.
// (tests/interop/check_hf_models.py, check_minilm.py and check_tokenizers.py hold the numbers
// and ids to transformers, sentence-transformers and tokenizers.)

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "bpe_json.h"
#include "te/distributed.h"
#include "te/hf/encoder.h"
#include "te/hf/sentence.h"
#include "te/hf/tokenizer.h"
#include "te/nn/inference.h"
#include "te/nn/init.h"
#include "te/nn/safetensors.h"

namespace te::hf {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

json bert_config() {
  return {{"model_type", "bert"},
          {"architectures", {"BertModel"}},
          {"vocab_size", 40},
          {"hidden_size", 16},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"intermediate_size", 24},
          {"max_position_embeddings", 12},
          {"type_vocab_size", 2},
          {"hidden_act", "gelu"},
          {"layer_norm_eps", 1e-12},
          {"hidden_dropout_prob", 0.1},
          {"attention_probs_dropout_prob", 0.1},
          {"pad_token_id", 0},
          {"position_embedding_type", "absolute"},
          {"transformers_version", "4.8.2"}};
}

EncoderConfig parse(const json& j) { return parse_encoder_config(j.dump(), "config.json"); }

// A random encoder of `config` saved as a Hugging Face directory, its tensors under `prefix`.
Encoder save_random(const fs::path& dir, const json& config, const std::string& prefix = "") {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  te::nn::manual_seed(3);
  Encoder model(parse(config));
  std::map<std::string, at::Tensor> whole;
  for (const auto& p : model->named_parameters()) whole[p.key()] = p.value().detach();
  auto hf = to_hf_tensors(encoder_weight_map(model->config, prefix), whole);
  hf[prefix + "embeddings.position_ids"] = at::arange(12, at::kLong).view({1, 12});
  te::nn::write_safetensors((dir / "model.safetensors").string(), hf);
  model->eval();
  return model;
}

const at::Tensor kIds = at::tensor({5, 9, 0, 33, 2, 7, 1, 3}, at::kLong).view({2, 4});
const at::Tensor kMask = at::tensor({1, 1, 1, 1, 1, 1, 0, 0}, at::kLong).view({2, 4});

TEST(HfEncoder, ReadsBertConfigsAndRefusesWhatItDoesNotHonour) {
  const EncoderConfig c = parse(bert_config());
  EXPECT_EQ(c.activation, "gelu_exact");
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.max_position_embeddings, 12);
  json j = bert_config();
  j["hidden_act"] = "gelu_new";
  EXPECT_EQ(parse(j).activation, "gelu");
  j = bert_config();
  j["model_type"] = "llama";
  EXPECT_ERROR(parse(j), "model_type: 'llama' is not an encoder family");
  j = bert_config();
  j["architectures"] = {"RobertaModel"};
  EXPECT_ERROR(parse(j), "architectures: entry \"RobertaModel\" is not a BERT architecture");
  j = bert_config();
  j["hidden_act"] = "gelu_fast";
  EXPECT_ERROR(parse(j), "hidden_act: 'gelu_fast' is not an activation");
  j = bert_config();
  j["position_embedding_type"] = "relative_key";
  EXPECT_ERROR(parse(j), "position_embedding_type: 'relative_key'");
  j = bert_config();
  j["is_decoder"] = true;
  EXPECT_ERROR(parse(j), "is_decoder: true makes BERT a causal decoder");
  j = bert_config();
  j["num_attention_heads"] = 5;
  EXPECT_ERROR(parse(j), "num_attention_heads: 5 does not divide hidden_size 16");
  j = bert_config();
  j["pad_token_id"] = 40;
  EXPECT_ERROR(parse(j), "pad_token_id: 40 is not a row of the 40-token vocabulary");
  j = bert_config();
  j["rotary_dim"] = 8;
  EXPECT_ERROR(parse(j), "rotary_dim: is not a field te-cpp honours");
}

TEST(HfEncoder, ASavedEncoderLoadsBackOnOneProcessAndOnTwoRanks) {
  for (const std::string prefix : {"", "bert."}) {
    test::TempDir dir;
    Encoder saved = save_random(dir.path(), bert_config(), prefix);
    const at::Tensor want = saved->forward(kIds, kMask);
    Encoder loaded = load_encoder(dir.path().string());
    EXPECT_FALSE(loaded->is_training());
    ASSERT_TRUE(loaded->pooler);
    EXPECT_TRUE(at::allclose(loaded->forward(kIds, kMask), want, 1e-6, 1e-6)) << prefix;
    EXPECT_TRUE(
        at::allclose(loaded->pool(loaded->forward(kIds, kMask)), saved->pool(want), 1e-6, 1e-6));
    std::mutex mutex;
    te::run_local_ranks(2, [&](int) {
      te::DeviceMesh mesh({2}, {"model"});
      te::MeshScope on(mesh);
      te::MeshResourceScope tp(te::parse_mesh_resource("tp=model"));
      te::AxisRulesScope rules(te::extend_logical_axis_rules(te::parse_axis_rules("vocab=model")));
      Encoder sharded = load_encoder(dir.path().string());
      const at::Tensor got = sharded->forward_on_mesh(kIds, kMask).full_tensor();
      // Each rank holds its slices only: well under the whole model's elements.
      int64_t local = 0, whole = 0;
      for (const auto& p : sharded->parameters()) local += p.numel();
      for (const auto& p : saved->parameters()) whole += p.numel();
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << prefix;
      EXPECT_LT(local, whole * 3 / 4) << prefix;
    });
  }
}

TEST(HfEncoder, APoolerlessCheckpointAndBadInputsAreNamed) {
  test::TempDir dir;
  const json config = bert_config();
  save_random(dir.path(), config);
  const std::string file = (dir / "model.safetensors").string();
  te::nn::SafetensorsReader reader(file);
  std::map<std::string, at::Tensor> all;
  for (const std::string& name : reader.names()) all[name] = reader.read(name);
  all.erase("pooler.dense.weight");
  all.erase("pooler.dense.bias");
  te::nn::write_safetensors(file, all);
  Encoder model = load_encoder(dir.path().string());
  EXPECT_FALSE(model->pooler);
  const at::Tensor h = model->forward(kIds, kMask);
  EXPECT_ERROR(model->pool(h), "this model has no pooler");
  EXPECT_ERROR(model->forward(kIds, kMask.narrow(1, 0, 3)),
               "attention_mask must be [batch, seq] = [2, 4]");
  EXPECT_ERROR(model->forward(at::zeros({1, 13}, at::kLong)),
               "13 tokens are more than the model's");
  EXPECT_ERROR(mean_pool(h, kMask.narrow(0, 0, 1)), "mean_pool: attention_mask must be");
  all.erase("encoder.layer.1.output.dense.bias");
  te::nn::write_safetensors(file, all);
  EXPECT_ERROR(load_encoder(dir.path().string()),
               "lacks 'encoder.layer.1.output.dense.bias', which a bert model");
  // Mean pooling over tokens only, then unit length.
  const at::Tensor x = at::arange(12, at::kFloat).view({1, 4, 3});
  const at::Tensor m = at::tensor({1, 1, 0, 0}, at::kLong).view({1, 4});
  EXPECT_TRUE(at::allclose(mean_pool(x, m), at::tensor({1.5f, 2.5f, 3.5f}).view({1, 3})));
  EXPECT_NEAR(l2_normalize(mean_pool(x, m)).norm().item<double>(), 1.0, 1e-6);
}

// A WordPiece tokenizer.json of a few tokens, as tokenizers saves BERT's.
json tokenizer_json() {
  const std::vector<std::string> vocab = {"[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]",
                                          "hello", ",",      "world", "!",     "un",
                                          "##aff", "##able", "cafe",  "我"};
  json v = json::object();
  for (std::size_t i = 0; i < vocab.size(); ++i) v[vocab[i]] = i;
  json added = json::array();
  for (int id = 0; id < 5; ++id) {
    added.push_back({{"id", id},
                     {"content", vocab[static_cast<std::size_t>(id)]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer",
           {{"type", "BertNormalizer"},
            {"clean_text", true},
            {"handle_chinese_chars", true},
            {"strip_accents", nullptr},
            {"lowercase", true}}},
          {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "[CLS]"}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              {{"SpecialToken", {{"id", "[SEP]"}, {"type_id", 0}}}}}},
            {"pair", json::array()},
            {"special_tokens",
             {{"[CLS]", {{"id", "[CLS]"}, {"ids", {2}}, {"tokens", {"[CLS]"}}}},
              {"[SEP]", {{"id", "[SEP]"}, {"ids", {3}}, {"tokens", {"[SEP]"}}}}}}}},
          {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
          {"model",
           {{"type", "WordPiece"},
            {"unk_token", "[UNK]"},
            {"continuing_subword_prefix", "##"},
            {"max_input_chars_per_word", 100},
            {"vocab", v}}}};
}

Tokenizer tokenizer(const json& j) { return Tokenizer::from_json(j.dump(), "tokenizer.json"); }

TEST(HfTokenizer, EncodesAndDecodesAsWordPiece) {
  const Tokenizer tok = tokenizer(tokenizer_json());
  // Lower-cased, accents stripped, punctuation split, longest pieces first, CJK isolated, an
  // unknown word whole, special tokens matched in the raw text.
  const Encoding e = tok.encode("Hello, WORLD!  Unaffable Café我 xyz [MASK]");
  EXPECT_EQ(e.ids, (std::vector<int64_t>{2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 1, 4, 3}));
  EXPECT_EQ(tok.decode(e.ids), "hello, world! unaffable cafe 我");  // [UNK] is special
  EXPECT_EQ(tok.decode(e.ids, false), "[CLS] hello, world! unaffable cafe 我 [UNK] [MASK] [SEP]");
  EXPECT_EQ(tok.encode("hello", {false, 0}).ids, (std::vector<int64_t>{5}));
  const Encoding cut = tok.encode("hello world hello", {true, 4});
  EXPECT_EQ(cut.ids, (std::vector<int64_t>{2, 5, 7, 3}));
  EXPECT_TRUE(cut.truncated);
  const Batch b = tok.encode_batch({"hello", "hello world !"});
  EXPECT_TRUE(at::equal(b.ids, at::tensor({2, 5, 3, 0, 0, 2, 5, 7, 8, 3}, at::kLong).view({2, 5})));
  EXPECT_EQ(b.attention_mask.sum().item<int64_t>(), 8);
  EXPECT_EQ(tok.token_to_id("world"), 7);
  EXPECT_EQ(tok.vocab_size(), 14);
}

TEST(HfTokenizer, NamesEveryBadFileAndInput) {
  const Tokenizer tok = tokenizer(tokenizer_json());
  EXPECT_ERROR(tok.encode("bad \xff byte"), "not UTF-8 (an invalid sequence at byte 4)");
  EXPECT_ERROR(tok.decode({99}), "id 99 is outside the vocabulary [0, 14)");
  EXPECT_ERROR(tok.encode("hello", {true, 1}), "max_length 1 leaves no room for the 2 special");
  json j = tokenizer_json();
  j["model"]["type"] = "Unigram";
  EXPECT_ERROR(tokenizer(j), "model.type: 'Unigram' is not a tokenizer model te-cpp implements");
  j = tokenizer_json();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_ERROR(tokenizer(j), "normalizer.type: 'NFKC' is not a normalizer");
  j = tokenizer_json();
  j["added_tokens"][4]["lstrip"] = true;
  EXPECT_ERROR(tokenizer(j), "added_tokens[].lstrip: true for '[MASK]'");
  j = tokenizer_json();
  j["model"]["vocab"].erase("[UNK]");
  EXPECT_ERROR(tokenizer(j), "model.vocab: entry");
  j = tokenizer_json();
  j["model"]["unk_token"] = "<unk>";
  EXPECT_ERROR(tokenizer(j), "the unknown token '<unk>' is not in the vocabulary");
  j = tokenizer_json();
  j["post_processor"]["type"] = "RobertaProcessing";
  EXPECT_ERROR(tokenizer(j), "post_processor.type: 'RobertaProcessing'");
  j = tokenizer_json();
  j["post_processor"] = {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}};  // no cls
  EXPECT_ERROR(tokenizer(j), "post_processor.cls");
  j = tokenizer_json();
  j["post_processor"]["single"].push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  EXPECT_ERROR(tokenizer(j), "the template must hold Sequence A once");
  j = tokenizer_json();
  j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {99};
  EXPECT_ERROR(tokenizer(j), "special token id 99 is not an id of the 14-token vocabulary");
  j = tokenizer_json();
  j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {"two"};
  EXPECT_ERROR(tokenizer(j), "a field has the wrong type");
  j = tokenizer_json();
  j["padding"] = {{"pad_id", -1}};
  EXPECT_ERROR(tokenizer(j), "padding.pad_id: -1 is not an id of the vocabulary");
  j = tokenizer_json();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}};
  EXPECT_ERROR(tokenizer(j), "te-cpp runs ByteLevel and Split with a BPE model, not WordPiece");
  j = tokenizer_json();
  j["decoder"]["fancy"] = 1;
  EXPECT_ERROR(tokenizer(j), "decoder.fancy: is not a field te-cpp honours");
  EXPECT_ERROR(Tokenizer::from_json("[1, 2", "t.json"), "tokenizer: 't.json' is not JSON");
  test::TempDir dir;
  EXPECT_ERROR(Tokenizer::from_pretrained(dir.path().string()),
               "holds neither tokenizer.json nor vocab.txt");
  std::ofstream(dir / "merges.txt") << "a b\n";
  EXPECT_ERROR(Tokenizer::from_file((dir / "merges.txt").string()),
               "is neither a tokenizer.json, a vocab.txt nor a .gguf file");
  std::ofstream(dir / "vocab.txt") << "[PAD]\nhello\n";
  EXPECT_ERROR(Tokenizer::from_file((dir / "vocab.txt").string()),
               "the unknown token '[UNK]' is not in the vocabulary");
}

// A byte-level BPE of a few tokens, as tokenizers saves GPT-2's kind.
json bpe_json() {
  return te::test::byte_level_bpe_json(
      {"<|end|>", "h", "e", "l", "o", "\u0120", "he", "ll", "hell", "hello", "\u0120h",
       "\u0120hello", "!"},
      {"h e", "l l", "he ll", "hell o", "\u0120 h", "\u0120h ello"}, "<|end|>", 0);
}

// Llama 2's layout: spaces as U+2581 (a Prepend and a Replace normalizer), no pre-tokenizer, BPE
// with byte fallback and a fused unknown token, and the decoders that undo it.
TEST(HfTokenizer, EncodesAndDecodesSentencePieceBpe) {
  const std::string sp = "\u2581";
  json j = {{"version", "1.0"},
            {"added_tokens", json::array()},
            {"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", sp}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder",
             {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
            {"model",
             {{"type", "BPE"},
              {"vocab",
               {{"<unk>", 0},
                {sp, 1},
                {"h", 2},
                {"i", 3},
                {sp + "h", 4},
                {sp + "hi", 5},
                {"<0xC3>", 6},
                {"<0xA9>", 7}}},
              {"merges", {sp + " h", sp + "h i"}},
              {"unk_token", "<unk>"},
              {"fuse_unk", true},
              {"byte_fallback", true}}}};
  const Tokenizer tok = tokenizer(j);
  // "\u2581hi\u2581\u00e9": merged to "\u2581hi", "\u2581" alone, and e-acute (not a token)
  // as its two bytes' tokens; decoded back with the prefixed space stripped.
  const Encoding e = tok.encode("hi \u00e9");
  EXPECT_EQ(e.ids, (std::vector<int64_t>{5, 1, 6, 7}));
  EXPECT_EQ(tok.decode(e.ids), "hi \u00e9");
  // Characters with neither a token nor byte tokens: one <unk> for the run.
  EXPECT_EQ(tok.encode("hxx").ids, (std::vector<int64_t>{4, 0}));
  // A byte token alone is not UTF-8: U+FFFD.
  EXPECT_EQ(tok.decode({6}), "\ufffd");
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " "}};
  EXPECT_ERROR(tokenizer(j), "normalizer.normalizers[1].pattern.String: is missing");
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_ERROR(tokenizer(j), "normalizer.type: 'Lowercase' is not a normalizer te-cpp implements");
  j["normalizer"] = nullptr;
  j["decoder"]["decoders"][3]["content"] = "ab";
  EXPECT_ERROR(tokenizer(j), "decoder.decoders[3].content: 'ab' is not one character");
}

TEST(HfTokenizer, EncodesAndDecodesByteLevelBpe) {
  json j = bpe_json();
  j["model"]["merges"].push_back("e o");  // "eo" is no token
  EXPECT_ERROR(tokenizer(j), "merge 6 ('e' 'o') makes 'eo', which is not in the vocabulary");
  j["model"]["merges"] = {"h e", "l l", "he ll", "hell o", "\u0120 h"};
  const Tokenizer tok = tokenizer(j);
  // GPT-2's regex splits "hello", " hello", "!"; " hello" is spelled "\u0120hello" and merges
  // lowest rank first: "h e" (0) before "\u0120 h" (4), so "\u0120" stays alone beside "hello".
  const Encoding e = tok.encode("hello hello!<|end|>");
  EXPECT_EQ(e.ids, (std::vector<int64_t>{9, 5, 9, 12, 0}));
  EXPECT_EQ(tok.decode(e.ids), "hello hello!");
  EXPECT_EQ(tok.decode(e.ids, false), "hello hello!<|end|>");
  j["model"]["unk_token"] = "<unk>";
  EXPECT_ERROR(tokenizer(j), "model.unk_token: '<unk>' is not in the vocabulary");
  j = bpe_json();
  j["model"]["dropout"] = 0.1;
  EXPECT_ERROR(tokenizer(j), "model.dropout: is set; te-cpp implements BPE without it");
  j = bpe_json();
  j["model"]["merges"] = {"h e l"};
  EXPECT_ERROR(tokenizer(j), "model.merges: entry \"h e l\" is not two tokens");
  j = bpe_json();
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  EXPECT_ERROR(tokenizer(j), "the pattern does not compile at offset");
  j["pre_tokenizer"]["behavior"] = "Removed";
  EXPECT_ERROR(tokenizer(j), "pre_tokenizer.behavior: 'Removed'");
  j = bpe_json();
  j["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_ERROR(tokenizer(j), "te-cpp runs BertNormalizer and BertPreTokenizer with a WordPiece");
  // A Split by a string takes it literally ("." is no wildcard): "h.e" is cut at ".".
  j = bpe_json();
  j["vocab"] = j["model"]["vocab"];
  j.erase("vocab");
  j["model"]["vocab"]["."] = 13;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"String", "."}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["model"]["merges"] = {"h e"};
  EXPECT_EQ(tokenizer(j).encode("h.ehe").ids, (std::vector<int64_t>{1, 13, 2, 6}));
}

TEST(HfSentenceEmbedder, Fp8WeightsAfterCalibrationKeepTheEmbeddings) {
  test::TempDir dir;
  save_random(dir.path(), bert_config());
  std::ofstream(dir.path() / "tokenizer.json") << tokenizer_json().dump();
  SentenceEmbedder st(dir.path().string());
  const std::vector<std::string> texts = {"hello, world!", "unaffable cafe", "我 hello world",
                                          "world"};
  const at::Tensor want = st.embed(texts);
  EXPECT_ERROR(st.freeze_fp8_weights({}), "no calibration texts");
  EXPECT_FALSE(te::nn::has_fp8_weights(*st.encoder()));
  // Three tables; query, key-value, output, MLP in and out in each of two layers; the pooler.
  EXPECT_EQ(st.freeze_fp8_weights(texts, 2), 14);
  for (const auto& p : st.encoder()->named_parameters()) {
    EXPECT_EQ(p.key().find("kernel"), std::string::npos) << p.key() << " kept in fp32";
    EXPECT_EQ(p.key().find("embedding"), std::string::npos) << p.key() << " kept in fp32";
  }
  const at::Tensor got = st.embed(texts);
  EXPECT_FALSE(at::allclose(got, want, 1e-6, 1e-6));  // FP8 does change the numbers
  EXPECT_GT((got * want).sum(1).min().item<double>(), 0.99);
  EXPECT_ERROR(st.freeze_fp8_weights(texts), "already holds FP8 weights");
}

}  // namespace
}  // namespace te::hf
