// libFuzzer target: te-encoder's CoLA TSV reader, tokenizer and vocabulary. Every input either
// reads or throws encoder::InputError (a one-line message naming the line); anything else is a
// bug. What it reads must tokenize, and every word must get an id inside the vocabulary.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>

#include "te/encoder/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    const std::vector<encoder::Example> examples = encoder::read_cola_tsv(in, "fuzz.tsv");
    encoder::Vocabulary vocab;
    vocab.add(examples);
    for (const encoder::Example& e : examples) {
      if (e.label != 0 && e.label != 1) __builtin_trap();
      for (const std::string& word : encoder::tokenize(e.sentence)) {
        if (word.empty()) {
          std::fprintf(stderr, "fuzz_cola: an empty word from '%s'\n", e.sentence.c_str());
          __builtin_trap();
        }
        const int64_t id = vocab.id(word);
        if (id < 2 || id >= vocab.size()) __builtin_trap();  // every word read was added
      }
    }
  } catch (const encoder::InputError&) {
  }
  return 0;
}
