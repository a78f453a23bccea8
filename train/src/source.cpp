// Data files into documents (te/train/source.h): plain text paragraphs, JSON lines with a text
// field, chat JSON lines with a messages list.

#include "te/train/source.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "te/error.h"

namespace te::train {
namespace {

using json = nlohmann::json;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\v\f") == std::string::npos;
}

// The length of the UTF-8 sequence starting at `s[i]`, or 0 when it is not one (overlong forms,
// surrogates and code points past U+10FFFF included).
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = c >= 0xC2 && c <= 0xDF ? 2 : (c & 0xF0) == 0xE0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
  }
  if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
  if (c == 0xED && b(1) >= 0xA0) return 0;  // surrogate
  if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
  if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
  return n;
}

std::vector<Document> read_paragraphs(const std::string& content) {
  std::vector<Document> docs;
  std::istringstream in(content);
  std::string line, text;
  int64_t number = 0, start = 0;
  auto flush = [&] {
    if (!text.empty()) docs.push_back({text, {}, start});
    text.clear();
  };
  while (std::getline(in, line)) {
    ++number;
    if (blank(line)) {
      flush();
      continue;
    }
    if (text.empty()) start = number;
    text += text.empty() ? line : "\n" + line;
  }
  flush();
  return docs;
}

std::string where(const std::string& path, int64_t line) {
  return path + ":" + std::to_string(line);
}

json parse_line(const std::string& path, int64_t number, const std::string& line) {
  json record;
  try {
    record = json::parse(line);
  } catch (const json::parse_error& e) {
    TE_FAIL(where(path, number), ": not JSON (", e.what(),
            "); each line of a JSON lines file must be one JSON object");
  }
  TE_CHECK(record.is_object(), where(path, number), ": a JSON ", record.type_name(),
           ", not an object; each line of a JSON lines file must be one JSON object");
  return record;
}

std::vector<te::gen::ChatMessage> read_messages(const std::string& at, const json& record) {
  TE_CHECK(record.contains("messages") && record["messages"].is_array(), at,
           ": no \"messages\" list; each line of a chat file must be {\"messages\": [{\"role\": "
           "..., \"content\": ...}, ...]}");
  std::vector<te::gen::ChatMessage> messages;
  for (const json& m : record["messages"]) {
    TE_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                 m.contains("content") && m["content"].is_string(),
             at, ": a message that is not {\"role\": string, \"content\": string}: ",
             m.dump().substr(0, 80));
    const std::string role = m["role"].get<std::string>();
    TE_CHECK(role == "system" || role == "user" || role == "assistant", at, ": role \"", role,
             "\"; te-train knows the roles system, user and assistant");
    messages.push_back({role, m["content"].get<std::string>()});
  }
  TE_CHECK(!messages.empty(), at, ": an empty \"messages\" list; a conversation needs a message");
  return messages;
}

std::vector<Document> read_json_lines(const std::string& path, const std::string& content,
                                      SourceKind kind, const std::string& field) {
  std::vector<Document> docs;
  std::istringstream in(content);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (blank(line)) continue;
    const json record = parse_line(path, number, line);
    const std::string at = where(path, number);
    if (kind == SourceKind::kChat) {
      docs.push_back({"", read_messages(at, record), number});
      continue;
    }
    TE_CHECK(record.contains(field) && record[field].is_string(), at, ": no string field \"", field,
             "\"; name the field that holds the text (te-train --text-field)");
    docs.push_back({record[field].get<std::string>(), {}, number});
  }
  return docs;
}

}  // namespace

SourceKind parse_source_kind(const std::string& name) {
  for (SourceKind k : {SourceKind::kAuto, SourceKind::kText, SourceKind::kJsonl, SourceKind::kChat})
    if (name == source_kind_name(k)) return k;
  TE_FAIL("data format \"", name, "\": te-train reads auto, text, jsonl or chat");
}

const char* source_kind_name(SourceKind kind) {
  switch (kind) {
    case SourceKind::kText:
      return "text";
    case SourceKind::kJsonl:
      return "jsonl";
    case SourceKind::kChat:
      return "chat";
    default:
      return "auto";
  }
}

void check_utf8(const std::string& path, const std::string& content) {
  int64_t line = 1;
  for (size_t i = 0; i < content.size();) {
    const size_t n = utf8_length(content, i);
    TE_CHECK(n > 0, path, ":", line, ": not UTF-8 (byte offset ", i,
             "); convert the file to UTF-8 (iconv -t UTF-8)");
    if (content[i] == '\n') ++line;
    i += n;
  }
}

SourceKind detect_source_kind(const std::string& path, const std::string& content,
                              const SourceOptions& options) {
  if (options.kind != SourceKind::kAuto) return options.kind;
  if (!ends_with(path, ".jsonl") && !ends_with(path, ".json")) return SourceKind::kText;
  std::istringstream in(content);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (blank(line)) continue;
    const json record = parse_line(path, number, line);
    return record.contains("messages") ? SourceKind::kChat : SourceKind::kJsonl;
  }
  return SourceKind::kJsonl;
}

Source parse_source(const std::string& path, const std::string& content,
                    const SourceOptions& options) {
  TE_CHECK(!content.empty(), path, ": empty; give te-train a data file with text in it");
  check_utf8(path, content);
  Source source{path, detect_source_kind(path, content, options), {}};
  source.documents = source.kind == SourceKind::kText
                         ? read_paragraphs(content)
                         : read_json_lines(path, content, source.kind, options.text_field);
  TE_CHECK(!source.documents.empty(), path,
           ": holds no document (only blank lines); give "
           "te-train a data file with text in it");
  return source;
}

Source read_source(const std::string& path, const SourceOptions& options) {
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), path, ": cannot open the data file; check the path (te-train --data)");
  std::ostringstream content;
  content << in.rdbuf();
  return parse_source(path, content.str(), options);
}

}  // namespace te::train
