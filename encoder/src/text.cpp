#include "te/encoder/text.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace encoder {

namespace {

std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t tab = line.find('\t', start);
    out.push_back(line.substr(start, tab == std::string::npos ? std::string::npos : tab - start));
    if (tab == std::string::npos) break;
    start = tab + 1;
  }
  return out;
}

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

bool ends_with_ci(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  for (std::size_t i = 0; i < suffix.size(); ++i) {
    const char a = s[s.size() - suffix.size() + i];
    if (std::tolower(static_cast<unsigned char>(a)) != suffix[i]) return false;
  }
  return true;
}

// Splits Treebank contractions off one whitespace token.
void push_word(std::string w, std::vector<std::string>& out) {
  if (w.empty()) return;
  std::string lower = w;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "cannot") {
    out.push_back(w.substr(0, 3));
    out.push_back(w.substr(3));
    return;
  }
  if (w.size() > 3 && ends_with_ci(w, "n't")) {
    out.push_back(w.substr(0, w.size() - 3));
    out.push_back(w.substr(w.size() - 3));
    return;
  }
  for (const char* suffix : {"'s", "'m", "'d", "'re", "'ve", "'ll"}) {
    const std::string s = suffix;
    if (w.size() > s.size() && ends_with_ci(w, s)) {
      out.push_back(w.substr(0, w.size() - s.size()));
      out.push_back(w.substr(w.size() - s.size()));
      return;
    }
  }
  out.push_back(std::move(w));
}

}  // namespace

std::vector<Example> read_cola_tsv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError("cannot read data file '" + path + "'");
  return read_cola_tsv(in, path);
}

std::vector<Example> read_cola_tsv(std::istream& in, const std::string& path) {
  std::vector<Example> out;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const auto cols = split_tabs(line);
    const std::string where = path + ":" + std::to_string(number);
    if (cols.size() < 4) {
      throw InputError(where +
                       ": expected 4 tab-separated columns (source, label, mark, "
                       "sentence), found " +
                       std::to_string(cols.size()));
    }
    if (cols[1] != "0" && cols[1] != "1") {
      throw InputError(where + ": label '" + cols[1] + "' is not 0 or 1");
    }
    std::string sentence = cols[3];
    for (std::size_t i = 4; i < cols.size(); ++i) sentence += " " + cols[i];
    out.push_back({std::move(sentence), cols[1] == "1" ? 1 : 0});
  }
  if (out.empty()) throw InputError("data file '" + path + "' holds no examples");
  return out;
}

std::pair<std::string, std::string> cola_files(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) throw InputError("--data '" + dir + "' is not a directory");
  for (const auto& [train, dev] :
       {std::pair<const char*, const char*>{"in_domain_train.tsv", "in_domain_dev.tsv"},
        {"train.tsv", "dev.tsv"}}) {
    const fs::path t = fs::path(dir) / train, d = fs::path(dir) / dev;
    if (fs::exists(t) || fs::exists(d)) return {t.string(), d.string()};
  }
  throw InputError("--data '" + dir +
                   "' holds neither in_domain_train.tsv + in_domain_dev.tsv nor train.tsv + "
                   "dev.tsv");
}

std::vector<std::string> tokenize(const std::string& sentence) {
  // Pad punctuation with spaces, then split on whitespace.
  std::string s;
  s.reserve(sentence.size() * 2);
  const std::size_t n = sentence.size();
  for (std::size_t i = 0; i < n; ++i) {
    const char c = sentence[i];
    const bool at_start = i == 0 || is_space(sentence[i - 1]) ||
                          std::string("([{<").find(sentence[i - 1]) != std::string::npos;
    if (c == '"') {
      s += at_start ? " `` " : " '' ";
    } else if (c == '.' && i + 2 < n && sentence[i + 1] == '.' && sentence[i + 2] == '.') {
      s += " ... ";
      i += 2;
    } else if (c == '-' && i + 1 < n && sentence[i + 1] == '-') {
      s += " -- ";
      ++i;
    } else if (c == ',' &&
               !(i > 0 && i + 1 < n && std::isdigit(static_cast<unsigned char>(sentence[i - 1])) &&
                 std::isdigit(static_cast<unsigned char>(sentence[i + 1])))) {
      s += " , ";
    } else if (std::string("?!;@#$%&()[]{}<>").find(c) != std::string::npos) {
      s += ' ';
      s += c;
      s += ' ';
    } else if (c == ':' &&
               !(i + 1 < n && std::isdigit(static_cast<unsigned char>(sentence[i + 1])))) {
      s += " : ";
    } else if (c == '\'' && at_start) {
      s += " ' ";  // an opening single quote
    } else {
      s += c;
    }
  }
  // The sentence-final period (before closing quotes or brackets) is a token of its own.
  std::size_t end = s.find_last_not_of(" \t");
  while (end != std::string::npos && end > 0 &&
         (s[end] == ' ' || s[end] == ')' || s[end] == ']' || s[end] == '}' || s[end] == '\'' ||
          s[end] == '>')) {
    --end;
  }
  if (end != std::string::npos && s[end] == '.' && (end == 0 || s[end - 1] != '.')) {
    s.replace(end, 1, " . ");
  }
  std::vector<std::string> out;
  std::istringstream words(s);
  std::string w;
  while (words >> w) {
    // A closing single quote after a word ("dogs'") is split off as its own token.
    if (w.size() > 1 && w.back() == '\'' && w != "''") {
      push_word(w.substr(0, w.size() - 1), out);
      out.emplace_back("'");
    } else {
      push_word(w, out);
    }
  }
  return out;
}

void Vocabulary::add(const std::vector<Example>& examples) {
  for (const Example& e : examples) {
    for (const std::string& w : tokenize(e.sentence)) {
      if (ids_.count(w)) continue;
      ids_.emplace(w, size());
      words_.push_back(w);
    }
  }
}

void Vocabulary::add_words(const std::vector<std::string>& words) {
  for (const std::string& w : words) {
    if (ids_.count(w)) throw InputError("the vocabulary lists the word '" + w + "' twice");
    ids_.emplace(w, size());
    words_.push_back(w);
  }
}

int64_t Vocabulary::id(const std::string& word) const {
  const auto it = ids_.find(word);
  return it == ids_.end() ? kUnknown : it->second;
}

double matthews(int64_t tp, int64_t tn, int64_t fp, int64_t fn) {
  const double d = std::sqrt(double(tp + fp) * double(tp + fn) * double(tn + fp) * double(tn + fn));
  return d > 0 ? (double(tp) * double(tn) - double(fp) * double(fn)) / d : 0.0;
}

}  // namespace encoder
