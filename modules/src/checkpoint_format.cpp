#include "checkpoint_format.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "te/error.h"

namespace te::nn::format {

namespace {

using nlohmann::json;

// Every dim and every count fits far below this, so sums and products of two never overflow.
constexpr int64_t kMaxDim = int64_t{1} << 48;
constexpr int64_t kMaxBytes = int64_t{1} << 62;

// A value as it appears in a message: its JSON, cut at 80 characters.
std::string brief(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// Reads one document's fields, naming the document and the field in every complaint.
struct Fields {
  std::string document;  // "'/x/model.safetensors.index.json'", "the header of '/x/a.safetensors'"
  std::string what;      // "load_checkpoint: " or "checkpoint: "

  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    TE_FAIL(what, document, " is damaged at ", field, ": ", why,
            "; save the checkpoint again or restore it from a copy");
  }
  const json& member(const json& object, const std::string& field, const char* key) const {
    const auto it = object.find(key);
    if (it == object.end()) fail(field, std::string("'") + key + "' is missing");
    return *it;
  }
  int64_t integer(const json& v, const std::string& field, int64_t lo, int64_t hi) const {
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + brief(v));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi)
                               : v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      fail(field,
           brief(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return v.get<int64_t>();
  }
  std::string string(const json& v, const std::string& field) const {
    if (!v.is_string()) fail(field, "expected a string, got " + brief(v));
    return v.get<std::string>();
  }
  // An array of `count` (any count when negative) integers in [0, kMaxDim].
  std::vector<int64_t> dims(const json& v, const std::string& field, int64_t count) const {
    if (!v.is_array()) fail(field, "expected an array of integers, got " + brief(v));
    if (count >= 0 && static_cast<int64_t>(v.size()) != count) {
      fail(field, "expected " + std::to_string(count) + " entries, got " + brief(v));
    }
    std::vector<int64_t> out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      out.push_back(integer(v[i], field + "[" + std::to_string(i) + "]", 0, kMaxDim));
    }
    return out;
  }
  // A dtype this format knows, and a shape whose bytes stay within kMaxBytes.
  int64_t bytes_of(const std::string& dtype, const std::vector<int64_t>& shape,
                   const std::string& field) const {
    const int64_t width = dtype_bytes(dtype);
    if (width == 0) fail(field + ".dtype", "'" + dtype + "' is not a safetensors dtype");
    int64_t bytes = width;
    for (int64_t s : shape) {
      if (s != 0 && bytes > kMaxBytes / s) fail(field + ".shape", "the tensor is too large");
      bytes *= s;
    }
    return bytes;
  }
};

json parse_json(std::string_view text, const Fields& f) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    TE_FAIL(f.what, f.document, " is not JSON (", e.what(), "); the checkpoint is damaged");
  }
}

std::string quoted(const std::string& name) { return "'" + name + "'"; }

Piece parse_piece(const json& v, const std::string& field, const std::string& dtype, int64_t rank,
                  const Fields& f) {
  if (!v.is_object()) f.fail(field, "expected an object, got " + brief(v));
  Piece p;
  p.file = f.string(f.member(v, field, "file"), field + ".file");
  if (p.file.empty() || p.file == "." || p.file == ".." ||
      p.file.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
    f.fail(field + ".file", "'" + p.file + "' is not a file name inside the checkpoint");
  }
  p.shape = f.dims(f.member(v, field, "shape"), field + ".shape", rank);
  p.offsets = f.dims(f.member(v, field, "offsets"), field + ".offsets",
                     static_cast<int64_t>(p.shape.size()));
  const int64_t bytes = f.bytes_of(dtype, p.shape, field);
  const json& crcs = f.member(v, field, "crc32_blocks");
  if (!crcs.is_array() || static_cast<int64_t>(crcs.size()) != block_count(bytes)) {
    f.fail(field + ".crc32_blocks", "expected " + std::to_string(block_count(bytes)) +
                                        " checksums (one per MiB of the piece's " +
                                        std::to_string(bytes) + " bytes)");
  }
  for (std::size_t i = 0; i < crcs.size(); ++i) {
    p.crc32_blocks.push_back(static_cast<uint32_t>(
        f.integer(crcs[i], field + ".crc32_blocks[" + std::to_string(i) + "]", 0, 0xffffffffll)));
  }
  return p;
}

json piece_json(const Piece& p) {
  return {{"file", p.file},
          {"offsets", p.offsets},
          {"shape", p.shape},
          {"crc32_blocks", p.crc32_blocks}};
}

// The pieces of a tensor must cover it exactly once: inside it, disjoint, and as many elements.
void check_tiling(const TensorRecord& t, const std::string& field, const Fields& f) {
  int64_t total = 0;
  for (std::size_t i = 0; i < t.pieces.size(); ++i) {
    const Piece& a = t.pieces[i];
    for (std::size_t d = 0; d < t.shape.size(); ++d) {
      if (a.offsets[d] + a.shape[d] > t.shape[d]) {
        f.fail(field + ".pieces[" + std::to_string(i) + "]",
               "it reaches element " + std::to_string(a.offsets[d] + a.shape[d]) + " of dim " +
                   std::to_string(d) + ", which has " + std::to_string(t.shape[d]));
      }
    }
    const int64_t n = numel(a.shape);
    total += n;
    for (std::size_t j = 0; j < i && n > 0; ++j) {
      const Piece& b = t.pieces[j];
      bool overlap = numel(b.shape) > 0;
      for (std::size_t d = 0; d < t.shape.size() && overlap; ++d) {
        overlap = std::max(a.offsets[d], b.offsets[d]) <
                  std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
      }
      if (overlap) {
        f.fail(field + ".pieces",
               "pieces " + std::to_string(j) + " and " + std::to_string(i) + " overlap");
      }
    }
  }
  if (total != numel(t.shape)) {
    f.fail(field + ".pieces", "they hold " + std::to_string(total) + " of the tensor's " +
                                  std::to_string(numel(t.shape)) + " elements");
  }
}

}  // namespace

int64_t dtype_bytes(std::string_view name) {
  static const std::pair<std::string_view, int64_t> kTable[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [n, bytes] : kTable) {
    if (n == name) return bytes;
  }
  return 0;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

// ---- safetensors files -------------------------------------------------------------------

uint64_t header_length(const unsigned char (&le)[8], int64_t file_size, const std::string& path) {
  TE_CHECK(file_size >= 8, "checkpoint: '", path, "' is truncated (", file_size,
           " bytes; a safetensors file starts with an 8-byte header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | le[i];
  TE_CHECK(n <= static_cast<uint64_t>(file_size - 8), "checkpoint: '", path,
           "' has a header length of ", n, " bytes but only ", file_size - 8,
           " follow; the file is truncated or not safetensors");
  // The safetensors format's own limit (its reference reader refuses longer headers).
  TE_CHECK(n <= kMaxHeaderBytes, "checkpoint: '", path, "' has a header length of ", n,
           " bytes, more than safetensors allows (", kMaxHeaderBytes,
           "); the file is damaged or not safetensors");
  return n;
}

SafetensorsHeader parse_header(std::string_view text, int64_t file_size, const std::string& path) {
  const Fields f{"the header of '" + path + "'", "checkpoint: "};
  const json header = parse_json(text, f);
  if (!header.is_object()) f.fail("the top level", "expected an object");
  SafetensorsHeader out;
  out.data_start = 8 + static_cast<int64_t>(text.size());
  const int64_t data_bytes = file_size - out.data_start;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string field = quoted(name);
    if (!v.is_object()) f.fail(field, "expected an object, got " + brief(v));
    HeaderEntry e;
    e.dtype = f.string(f.member(v, field, "dtype"), field + ".dtype");
    e.shape = f.dims(f.member(v, field, "shape"), field + ".shape", -1);
    const int64_t bytes = f.bytes_of(e.dtype, e.shape, field);
    const auto range = f.dims(f.member(v, field, "data_offsets"), field + ".data_offsets", 2);
    e.begin = range[0];
    e.end = range[1];
    if (e.begin > e.end || e.end > data_bytes || e.end - e.begin != bytes) {
      TE_FAIL("checkpoint: tensor '", name, "' in '", path, "' has data offsets [", e.begin, ",",
              e.end, "] outside the file's ", data_bytes, " data bytes (or not matching its ",
              bytes, "-byte size); the file is damaged");
    }
    out.tensors.emplace(name, std::move(e));
  }
  return out;
}

std::string header_bytes(const std::map<std::string, HeaderEntry>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  for (const auto& [name, e] : tensors) {
    header[name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  return out + text;
}

// ---- the index ---------------------------------------------------------------------------

Index parse_index(std::string_view text, const std::string& path, const char* what) {
  const Fields f{"'" + path + "'", std::string(what) + ": "};
  const json index = parse_json(text, f);
  TE_CHECK(index.is_object() && index.contains("te") && index["te"].is_object() &&
               index["te"].contains("tensors") && index["te"]["tensors"].is_object(),
           what, ": '", path, "' is not a te-cpp checkpoint index (no te.tensors)");
  const json& te = index["te"];
  Index out;
  if (te.contains("world_size")) {
    out.world_size = f.integer(te["world_size"], "te.world_size", 1, 1 << 30);
  }
  if (te.contains("optimizer")) {
    if (!te["optimizer"].is_boolean()) f.fail("te.optimizer", "expected true or false");
    out.with_optimizer = te["optimizer"].get<bool>();
  }
  for (const auto& [name, v] : te["tensors"].items()) {
    const std::string field = "te.tensors." + quoted(name);
    if (!v.is_object()) f.fail(field, "expected an object, got " + brief(v));
    TensorRecord t;
    t.shape = f.dims(f.member(v, field, "shape"), field + ".shape", -1);
    t.dtype = f.string(f.member(v, field, "dtype"), field + ".dtype");
    f.bytes_of(t.dtype, t.shape, field);
    if (v.contains("axes")) {
      const json& axes = v["axes"];
      if (!axes.is_array() || (!axes.empty() && axes.size() != t.shape.size())) {
        f.fail(field + ".axes", "expected none or " + std::to_string(t.shape.size()) +
                                    " entries (a name or null per dim), got " + brief(axes));
      }
      for (std::size_t d = 0; d < axes.size(); ++d) {
        if (axes[d].is_null()) {
          t.axes.emplace_back();
        } else {
          t.axes.emplace_back(f.string(axes[d], field + ".axes[" + std::to_string(d) + "]"));
        }
      }
    }
    const json& pieces = f.member(v, field, "pieces");
    if (!pieces.is_array()) f.fail(field + ".pieces", "expected an array");
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      t.pieces.push_back(parse_piece(pieces[i], field + ".pieces[" + std::to_string(i) + "]",
                                     t.dtype, static_cast<int64_t>(t.shape.size()), f));
    }
    check_tiling(t, field, f);
    out.tensors.emplace(name, std::move(t));
  }
  if (te.contains("rng")) {
    const json& rng = te["rng"];
    if (!rng.is_object()) f.fail("te.rng", "expected an object");
    for (const char* key : {"seed", "calls"}) {
      const json& n = f.member(rng, "te.rng", key);
      if (!n.is_number_unsigned() && !(n.is_number_integer() && n.get<int64_t>() >= 0)) {
        f.fail(std::string("te.rng.") + key, "expected an unsigned integer, got " + brief(n));
      }
    }
    out.rng.emplace(rng["seed"].get<uint64_t>(), rng["calls"].get<uint64_t>());
  }
  if (index.contains("extra")) out.extra_json = index["extra"].dump();
  return out;
}

std::string index_text(const Index& index) {
  json tensors = json::object();
  json weight_map = json::object();
  bool whole = true;
  int64_t total = 0;
  for (const auto& [name, t] : index.tensors) {
    json axes = json::array();
    for (const auto& a : t.axes) axes.push_back(a ? json(*a) : json(nullptr));
    json pieces = json::array();
    for (const Piece& p : t.pieces) {
      pieces.push_back(piece_json(p));
      total += numel(p.shape) * dtype_bytes(t.dtype);
    }
    tensors[name] = {{"shape", t.shape}, {"dtype", t.dtype}, {"axes", axes}, {"pieces", pieces}};
    whole = whole && t.pieces.size() == 1 && t.pieces[0].shape == t.shape;
    if (!t.pieces.empty()) weight_map[name] = t.pieces[0].file;
  }
  json te = {{"world_size", index.world_size}, {"tensors", tensors}};
  if (index.rng) te["rng"] = {{"seed", index.rng->first}, {"calls", index.rng->second}};
  if (index.with_optimizer) te["optimizer"] = true;
  json out = {{"metadata", {{"total_size", total}, {"format", "te-cpp"}}},
              {"te", te},
              {"extra", json::parse(index.extra_json)}};
  // Hugging Face's index maps each tensor to the one file that holds it whole.
  if (whole) out["weight_map"] = weight_map;
  return out.dump(1);
}

std::string pieces_text(const std::map<std::string, RankPiece>& pieces) {
  json out = json::object();
  for (const auto& [name, p] : pieces) {
    out[name] = piece_json(p.piece);
    out[name]["dtype"] = p.dtype;
  }
  return out.dump();
}

std::map<std::string, RankPiece> parse_pieces(std::string_view text, const std::string& from) {
  const Fields f{"the piece list of " + from, "save_checkpoint: "};
  const json all = parse_json(text, f);
  if (!all.is_object()) f.fail("the top level", "expected an object");
  std::map<std::string, RankPiece> out;
  for (const auto& [name, v] : all.items()) {
    if (!v.is_object()) f.fail(quoted(name), "expected an object, got " + brief(v));
    RankPiece p;
    p.dtype = f.string(f.member(v, quoted(name), "dtype"), quoted(name) + ".dtype");
    p.piece = parse_piece(v, quoted(name), p.dtype, -1, f);
    out.emplace(name, std::move(p));
  }
  return out;
}

}  // namespace te::nn::format
