#pragma once

// te-train's data files read into documents (train/README.md):
//   - plain text (.txt, or any file that is not JSON lines): documents are the paragraphs, runs
//     of lines separated by one or more blank (empty or whitespace-only) lines, each kept as
//     written with its inner newlines; a file without blank lines is one document;
//   - JSON lines (.jsonl): one JSON object per non-empty line with a text field ("text" unless
//     SourceOptions::text_field says otherwise), one document each;
//   - chat JSON lines: one object per line with a "messages" list of {"role", "content"} (roles
//     system, user, assistant), one conversation each.
// The kind comes from SourceOptions::kind, else from the file: ".jsonl" / ".json" are JSON lines,
// chat when their first record has "messages"; anything else is plain text. Every file must be
// UTF-8. No LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "te/gen/chat_template.h"

namespace te::train {

enum class SourceKind { kAuto, kText, kJsonl, kChat };

/// "auto", "text", "jsonl" or "chat" (te-train's --data-format; te::Error naming another).
SourceKind parse_source_kind(const std::string& name);
const char* source_kind_name(SourceKind kind);

struct SourceOptions {
  SourceKind kind = SourceKind::kAuto;
  /// The field of a JSON line holding its text (kJsonl).
  std::string text_field = "text";
};

/// One document: its text (kText, kJsonl) or its conversation (kChat), and the 1-based line it
/// starts on (errors name it).
struct Document {
  std::string text;
  std::vector<te::gen::ChatMessage> messages;
  int64_t line = 0;
};

struct Source {
  std::string path;
  SourceKind kind = SourceKind::kText;  ///< never kAuto
  std::vector<Document> documents;
};

/// The kind `options` names, else the one the file's name and first record say.
SourceKind detect_source_kind(const std::string& path, const std::string& content,
                              const SourceOptions& options);

/// Reads `path`. te::Error naming the file (and its line, or byte offset for bad UTF-8) when it
/// is missing, empty, not UTF-8, holds no document, or a JSON line is not an object with the
/// text field (kJsonl) or a "messages" list of known roles (kChat).
Source read_source(const std::string& path, const SourceOptions& options = {});

/// The same for a file already in memory (`path` names it in errors).
Source parse_source(const std::string& path, const std::string& content,
                    const SourceOptions& options = {});

/// te::Error naming `path`, the line and the byte offset of the first byte that is not UTF-8.
void check_utf8(const std::string& path, const std::string& content);

}  // namespace te::train
