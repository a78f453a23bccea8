#pragma once

// CoLA for the encoder example, the text side (no tensors): GLUE-style TSV files, a
// word/punctuation tokenizer close to NLTK's word_tokenize, a vocabulary, and the CoLA metric.
// The fuzz target fuzz/fuzz_cola.cpp reads through these.

#include <cstdint>
#include <istream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "te/input_error.h"

namespace encoder {

/// Bad input the program reports in one line (exit code 2): te::InputError.
using InputError = te::InputError;

struct Example {
  std::string sentence;
  int64_t label = 0;
};

/// Reads a GLUE CoLA TSV file (no header; label in column 2, sentence in column 4). InputError
/// naming the file and line for a missing file, a line with fewer than 4 columns, a label other
/// than 0 or 1, or a file with no examples.
std::vector<Example> read_cola_tsv(const std::string& path);
/// The same from a stream; `name` stands for the file in messages.
std::vector<Example> read_cola_tsv(std::istream& in, const std::string& name);

/// The training and dev files of a GLUE-style CoLA directory: in_domain_train.tsv and
/// in_domain_dev.tsv, or train.tsv and dev.tsv. InputError when neither pair is there.
std::pair<std::string, std::string> cola_files(const std::string& dir);

/// Words and punctuation, case kept, in the manner of NLTK's word_tokenize (Penn Treebank
/// conventions): punctuation split off, the sentence-final period split, contractions split
/// ("don't" -> "do", "n't"; "I'm" -> "I", "'m"; "cannot" -> "can", "not"), double quotes as ``
/// and ''. Abbreviations inside a sentence ("Mr.") keep their period, as NLTK's does.
std::vector<std::string> tokenize(const std::string& sentence);

/// Word ids: 0 pads, 1 is unknown, words from 2 in order of first appearance.
class Vocabulary {
 public:
  static constexpr int64_t kPad = 0;
  static constexpr int64_t kUnknown = 1;
  /// Adds the words of `examples` not yet known.
  void add(const std::vector<Example>& examples);
  /// Adds `words` (from words() of a saved vocabulary) in order; InputError for a repeated word.
  void add_words(const std::vector<std::string>& words);
  int64_t id(const std::string& word) const;
  int64_t size() const { return static_cast<int64_t>(words_.size()) + 2; }
  const std::vector<std::string>& words() const { return words_; }

 private:
  std::map<std::string, int64_t> ids_;
  std::vector<std::string> words_;
};

/// Matthews correlation coefficient of a binary confusion matrix (GLUE's CoLA metric); 0 when a
/// row or column of the matrix is empty.
double matthews(int64_t tp, int64_t tn, int64_t fp, int64_t fn);

}  // namespace encoder
