// The token file's writer: reads and tokenizes a data file once, with a progress bar, into a
// temporary file renamed into place (te/train/token_file.h).

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "te/error.h"
#include "te/train/tokens.h"
#include "token_file_format.h"

namespace te::train::detail {
namespace {

// Tokenizing's progress on stderr: a bar redrawn at each percent on a terminal; a line when it
// starts and one when it ends otherwise (logs stay short).
class Progress {
 public:
  Progress(const std::string& what, int64_t total, bool enabled)
      : what_(what), total_(total), enabled_(enabled), tty_(::isatty(2) == 1) {
    if (enabled_ && !tty_)
      std::fprintf(stderr, "te-train: tokenizing %s: %lld documents\n", what_.c_str(),
                   static_cast<long long>(total_));
  }
  void update(int64_t done) {
    const int percent = total_ > 0 ? static_cast<int>(100 * done / total_) : 100;
    if (!enabled_ || !tty_ || percent == percent_) return;
    percent_ = percent;
    const int width = 30, filled = percent * width / 100;
    std::fprintf(stderr, "\rtokenizing %s [%s%s] %3d%% %lld/%lld documents", what_.c_str(),
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 percent, static_cast<long long>(done), static_cast<long long>(total_));
    std::fflush(stderr);
  }
  void finish(int64_t tokens, const std::string& path) {
    if (!enabled_) return;
    const double s = std::chrono::duration<double>(clock::now() - start_).count();
    std::fprintf(stderr, "%ste-train: %s: %lld tokens in %.1f s, written to %s\n", tty_ ? "\n" : "",
                 what_.c_str(), static_cast<long long>(tokens), s, path.c_str());
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string what_;
  int64_t total_;
  bool enabled_, tty_;
  int percent_ = -1;
  clock::time_point start_ = clock::now();
};

// Removes the temporary file unless it was renamed into place.
struct TemporaryFile {
  std::string path;
  bool kept = false;
  ~TemporaryFile() {
    if (!kept) std::remove(path.c_str());
  }
};

uint64_t options_hash(const TokenFileOptions& o) {
  std::string text = std::to_string(o.eos_id) + '\n' + source_kind_name(o.source.kind) + '\n' +
                     o.source.text_field + '\n' + (o.add_special_tokens ? "special" : "plain");
  if (o.chat_template) {
    text += '\n' + o.chat_template->family() + '\n' +
            o.chat_template->apply({{"user", "u"}, {"assistant", "a"}}, false);
  }
  return fnv1a(text.data(), text.size());
}

TokenizedDocument tokenize(const Source& source, const Document& doc,
                           const te::hf::Tokenizer& tokenizer, const TokenFileOptions& options) {
  if (source.kind != SourceKind::kChat)
    return tokenize_text(tokenizer, doc.text, options.eos_id, options.add_special_tokens);
  return tokenize_chat(tokenizer, *options.chat_template, doc.messages,
                       source.path + ":" + std::to_string(doc.line));
}

void write_tokens(std::ofstream& out, const std::vector<int64_t>& ids, const std::string& where) {
  std::vector<uint32_t> narrow(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    TE_CHECK(ids[i] >= 0 && ids[i] <= 0xFFFFFFFFLL, where, ": token id ", ids[i],
             " does not fit the token file's uint32; check --eos-id");
    narrow[i] = static_cast<uint32_t>(ids[i]);
  }
  out.write(reinterpret_cast<const char*>(narrow.data()), 4 * narrow.size());
}

}  // namespace

Header expected_header(const std::string& data_path, const te::hf::Tokenizer& tokenizer,
                       const TokenFileOptions& options) {
  struct stat st {};
  TE_CHECK(::stat(data_path.c_str(), &st) == 0, data_path,
           ": cannot open the data file; check the path (te-train --data)");
  TE_CHECK(options.eos_id >= 0 && options.eos_id < tokenizer.vocab_size(), "eos id ",
           options.eos_id, " is outside the tokenizer's vocabulary of ", tokenizer.vocab_size(),
           "; pass the model's eos token id");
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.tokenizer_fingerprint = tokenizer_fingerprint(tokenizer);
  h.source_size = static_cast<uint64_t>(st.st_size);
  h.source_mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  h.options_hash = options_hash(options);
  return h;
}

void write_token_file(const std::string& data_path, const std::string& path,
                      const te::hf::Tokenizer& tokenizer, const TokenFileOptions& options,
                      Header header) {
  const Source source = read_source(data_path, options.source);
  TE_CHECK(source.kind != SourceKind::kChat || options.chat_template.has_value(), data_path,
           ": chat data needs the model's chat template, and none was given (the model's files "
           "have no chat_template); use a model with one, or text data");
  const bool masked = source.kind == SourceKind::kChat;
  TemporaryFile tmp{path + ".tmp." + std::to_string(::getpid())};
  std::ofstream out(tmp.path, std::ios::binary | std::ios::trunc);
  TE_CHECK(out.good(), tmp.path, ": cannot write the token file; pick a writable --token-file");
  out.write(reinterpret_cast<const char*>(&header), sizeof header);
  std::vector<int64_t> offsets{0};
  std::vector<uint8_t> mask;
  Progress progress(data_path, static_cast<int64_t>(source.documents.size()), options.progress);
  for (const Document& doc : source.documents) {
    const TokenizedDocument t = tokenize(source, doc, tokenizer, options);
    write_tokens(out, t.ids, data_path + ":" + std::to_string(doc.line));
    offsets.push_back(offsets.back() + static_cast<int64_t>(t.ids.size()));
    if (masked) mask.insert(mask.end(), t.mask.begin(), t.mask.end());
    progress.update(static_cast<int64_t>(offsets.size()) - 1);
  }
  header.num_tokens = static_cast<uint64_t>(offsets.back());
  header.num_documents = offsets.size() - 1;
  header.flags = masked ? kHasLossMask : 0;
  const std::vector<char> pad(offsets_at(header.num_tokens) - sizeof header -
                              4 * header.num_tokens);
  out.write(pad.data(), static_cast<std::streamsize>(pad.size()));
  out.write(reinterpret_cast<const char*>(offsets.data()), 8 * offsets.size());
  out.write(reinterpret_cast<const char*>(mask.data()), static_cast<std::streamsize>(mask.size()));
  out.seekp(0);
  out.write(reinterpret_cast<const char*>(&header), sizeof header);
  out.close();
  TE_CHECK(!out.fail(), tmp.path, ": writing the token file failed (disk full?)");
  TE_CHECK(std::rename(tmp.path.c_str(), path.c_str()) == 0, path,
           ": cannot rename the finished token file into place; pick a writable --token-file");
  tmp.kept = true;
  progress.finish(offsets.back(), path);
}

}  // namespace te::train::detail
