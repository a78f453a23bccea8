// te::train's sources and tokenizing: paragraphs, JSON lines, chat lines, their errors; text
// with EOS, the chat mask on exactly the assistant spans, the tokenizer's fingerprint.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "te/train/source.h"
#include "te/train/tokens.h"
#include "train_fixtures.h"

namespace {

using te::train::parse_source;
using te::train::read_source;
using te::train::SourceKind;

TEST(Source, PlainTextIsParagraphsSeparatedByBlankLines) {
  const auto s = parse_source("a.txt", "one\ntwo\n\n \n\nthree\n\n\nfour");
  EXPECT_EQ(s.kind, SourceKind::kText);
  ASSERT_EQ(s.documents.size(), 3u);
  EXPECT_EQ(s.documents[0].text, "one\ntwo");
  EXPECT_EQ(s.documents[1].text, "three");
  EXPECT_EQ(s.documents[1].line, 6);
  EXPECT_EQ(s.documents[2].text, "four");
}

TEST(Source, JsonLinesWithATextFieldAndChatLinesAreDetected) {
  const auto j = parse_source("a.jsonl", "{\"text\": \"x\"}\n\n{\"text\": \"y\", \"id\": 2}\n");
  EXPECT_EQ(j.kind, SourceKind::kJsonl);
  ASSERT_EQ(j.documents.size(), 2u);
  EXPECT_EQ(j.documents[1].text, "y");
  EXPECT_EQ(j.documents[1].line, 3);
  te::train::SourceOptions body;
  body.text_field = "body";
  EXPECT_EQ(parse_source("a.jsonl", "{\"body\": \"z\"}", body).documents[0].text, "z");
  const auto c = parse_source("c.jsonl",
                              "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, "
                              "{\"role\": \"assistant\", \"content\": \"Hello\"}]}\n");
  EXPECT_EQ(c.kind, SourceKind::kChat);
  ASSERT_EQ(c.documents[0].messages.size(), 2u);
  EXPECT_EQ(c.documents[0].messages[1].content, "Hello");
  te::train::SourceOptions as_text;
  as_text.kind = SourceKind::kText;
  EXPECT_EQ(parse_source("c.jsonl", "{\"a\": 1}", as_text).kind, SourceKind::kText);
  EXPECT_EQ(te::train::parse_source_kind("chat"), SourceKind::kChat);
  EXPECT_ERROR(te::train::parse_source_kind("csv"), "data format \"csv\"");
}

TEST(Source, BadFilesAreErrorsNamingTheFileAndLine) {
  te::test::TempDir dir;
  EXPECT_ERROR(read_source((dir / "missing.txt").string()), "missing.txt: cannot open");
  te::test::write_file((dir / "empty.txt").string(), "");
  EXPECT_ERROR(read_source((dir / "empty.txt").string()), "empty.txt: empty");
  EXPECT_ERROR(parse_source("blank.txt", "\n  \n\n"), "blank.txt: holds no document");
  EXPECT_ERROR(parse_source("bad.txt", "fine\nstill fine\nbad \xff byte\n"),
               "bad.txt:3: not UTF-8 (byte offset 20)");
  EXPECT_ERROR(parse_source("bad.txt", "overlong \xc0\xaf"), "bad.txt:1: not UTF-8");
  EXPECT_ERROR(parse_source("bad.txt", "surrogate \xed\xa0\x80"), "not UTF-8 (byte offset 10)");
  EXPECT_ERROR(parse_source("cut.txt", "cut \xe2\x82"), "cut.txt:1: not UTF-8");
  EXPECT_ERROR(parse_source("a.jsonl", "{\"text\": \"x\"}\n{\"text\": \"y\"\n"),
               "a.jsonl:2: not JSON");
  EXPECT_ERROR(parse_source("a.jsonl", "{\"text\": \"x\"}\n[1, 2]\n"), "a.jsonl:2: a JSON array");
  EXPECT_ERROR(parse_source("a.jsonl", "{\"text\": \"x\"}\n{\"txt\": \"y\"}\n"),
               "a.jsonl:2: no string field \"text\"");
  const std::string user = "{\"role\": \"user\", \"content\": \"Hi\"}";
  EXPECT_ERROR(parse_source("c.jsonl", "{\"messages\": [" + user + "]}\n{\"msgs\": []}\n",
                            {SourceKind::kChat, "text"}),
               "c.jsonl:2: no \"messages\" list");
  EXPECT_ERROR(parse_source("c.jsonl", "{\"messages\": [" + user +
                                           ", {\"role\": \"tool\", \"content\": \"x\"}]}"),
               "c.jsonl:1: role \"tool\"");
  EXPECT_ERROR(parse_source("c.jsonl", "{\"messages\": [{\"role\": \"user\"}]}"),
               "c.jsonl:1: a message that is not");
  EXPECT_ERROR(parse_source("c.jsonl", "{\"messages\": []}"), "c.jsonl:1: an empty");
}

TEST(Tokens, TextDocumentsAreTheirTokensThenEos) {
  const auto& tok = te::test::bpe_tokenizer();
  const auto doc = te::train::tokenize_text(tok, "Hello world", 0);
  std::vector<int64_t> want = tok.encode("Hello world", {false, 0}).ids;
  want.push_back(0);
  EXPECT_EQ(doc.ids, want);
  EXPECT_EQ(doc.mask, std::vector<uint8_t>(want.size(), 1));
}

// The masked tokens, decoded run by run: exactly the assistant messages' content and their
// <|im_end|>, derived by hand from the ChatML rendering.
TEST(Tokens, ChatMaskMarksExactlyTheAssistantContentAndItsEndOfTurn) {
  const auto& tok = te::test::bpe_tokenizer();
  const std::vector<te::gen::ChatMessage> chat = {{"user", "Hi there"},
                                                  {"assistant", "Hello! How are you?"},
                                                  {"user", "Fine, bye."},
                                                  {"assistant", " See you\n"}};
  const auto doc = te::train::tokenize_chat(tok, te::test::chatml_template(), chat, "c.jsonl:1");
  const std::string whole =
      "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
      "<|im_start|>assistant\nHello! How are you?<|im_end|>\n<|im_start|>user\nFine, "
      "bye.<|im_end|>\n<|im_start|>assistant\n See you\n<|im_end|>\n";
  EXPECT_EQ(doc.ids, tok.encode(whole, {false, 0}).ids);
  ASSERT_EQ(doc.mask.size(), doc.ids.size());
  std::vector<std::string> runs, rest;
  for (size_t i = 0; i < doc.ids.size();) {
    size_t j = i;
    while (j < doc.ids.size() && doc.mask[j] == doc.mask[i]) ++j;
    const std::string text = tok.decode({doc.ids.begin() + i, doc.ids.begin() + j}, false);
    (doc.mask[i] ? runs : rest).push_back(text);
    i = j;
  }
  EXPECT_EQ(runs,
            (std::vector<std::string>{"Hello! How are you?<|im_end|>", " See you\n<|im_end|>"}));
  EXPECT_EQ(rest.back(), "\n");
  EXPECT_EQ(rest[1], "\n<|im_start|>user\nFine, bye.<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Tokens, ChatThatStartsWithTheAssistantOrThatTheTemplateRefusesIsAnError) {
  const auto& tok = te::test::bpe_tokenizer();
  const auto chatml = te::test::chatml_template();
  EXPECT_ERROR(te::train::tokenize_chat(tok, chatml, {{"assistant", "x"}}, "c.jsonl:4"),
               "c.jsonl:4: the conversation starts with an assistant message");
  const auto gemma = te::gen::ChatTemplate::recognise(
      "{{ bos_token }}<start_of_turn>{{ role }}<end_of_turn>{% if add_generation_prompt %}",
      "gemma");
  EXPECT_ERROR(te::train::tokenize_chat(tok, gemma, {{"system", "s"}, {"user", "u"}}, "g.jsonl:2"),
               "g.jsonl:2: the chat template refuses this conversation");
}

TEST(Tokens, FingerprintChangesWithTheVocabularyOrTheSplitting) {
  std::ifstream in(te::test::bpe_tokenizer_path());
  const nlohmann::json json = nlohmann::json::parse(in);
  const auto fp = [](const nlohmann::json& j) {
    return te::train::tokenizer_fingerprint(te::hf::Tokenizer::from_json(j.dump(), "t.json"));
  };
  EXPECT_EQ(fp(json), te::train::tokenizer_fingerprint(te::test::bpe_tokenizer()));
  nlohmann::json fewer_merges = json;
  fewer_merges["model"]["merges"].erase(fewer_merges["model"]["merges"].begin());
  EXPECT_NE(fp(fewer_merges), fp(json));
  nlohmann::json swapped = json;
  auto& vocab = swapped["model"]["vocab"];
  std::swap(vocab["a"], vocab["b"]);
  EXPECT_NE(fp(swapped), fp(json));
}

}  // namespace
