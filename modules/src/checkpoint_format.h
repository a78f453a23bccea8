#pragma once

// The on-disk format of a te-cpp checkpoint, without tensors: the header of each safetensors file
// and the directory's index (model.safetensors.index.json). The parsers check everything the
// loader later relies on (types, ranks, bounds, that the pieces tile each tensor, checksum
// counts), so a damaged or hostile checkpoint ends in a te::Error that names the file and the
// field, never in a crash or a read out of bounds. No LibTorch here: fuzz/fuzz_checkpoint.cpp
// feeds these functions directly (docs/ARCHITECTURE.md §8).

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace te::nn::format {

inline constexpr const char* kIndexName = "model.safetensors.index.json";
/// Each piece's bytes carry one CRC-32 per block of this size, so a load that needs part of a
/// piece reads and verifies only the blocks holding that part.
inline constexpr int64_t kBlockBytes = int64_t{1} << 20;

/// The longest header a safetensors file may have (the format's reference reader's limit).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// Bytes per element of a safetensors dtype name ("F32", "BF16", "F8_E4M3", ...); 0 if unknown.
int64_t dtype_bytes(std::string_view name);
/// Elements of a shape (1 for a scalar's empty shape).
int64_t numel(const std::vector<int64_t>& shape);
/// Checksum blocks of a piece of `bytes` bytes.
inline int64_t block_count(int64_t bytes) { return (bytes + kBlockBytes - 1) / kBlockBytes; }

// ---- safetensors files -------------------------------------------------------------------

struct HeaderEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  ///< data_offsets, relative to the data after the header
  bool operator==(const HeaderEntry& o) const {
    return dtype == o.dtype && shape == o.shape && begin == o.begin && end == o.end;
  }
};

struct SafetensorsHeader {
  int64_t data_start = 0;  ///< 8 + the header's length: where the data begins in the file
  std::map<std::string, HeaderEntry> tensors;
};

/// The header length a file starts with (8 bytes, little-endian), checked against its size.
uint64_t header_length(const unsigned char (&le)[8], int64_t file_size, const std::string& path);
/// Parses the header text that follows the length, in a file of `file_size` bytes: every
/// tensor's dtype is known and its data offsets lie inside the file and match its size.
SafetensorsHeader parse_header(std::string_view text, int64_t file_size, const std::string& path);
/// What a safetensors file of these tensors starts with: the length, then the header JSON padded
/// with spaces so the data starts 8-byte aligned.
std::string header_bytes(const std::map<std::string, HeaderEntry>& tensors);

// ---- the index ---------------------------------------------------------------------------

/// One saved piece of a tensor: the box [offsets, offsets + shape) of it, in `file`.
struct Piece {
  std::string file;
  std::vector<int64_t> offsets, shape;
  std::vector<uint32_t> crc32_blocks;
  bool operator==(const Piece& o) const {
    return file == o.file && offsets == o.offsets && shape == o.shape &&
           crc32_blocks == o.crc32_blocks;
  }
};

struct TensorRecord {
  std::vector<int64_t> shape;
  std::string dtype;
  /// The logical axis of each dim (nullopt: unconstrained); empty for tensors without a layout.
  std::vector<std::optional<std::string>> axes;
  std::vector<Piece> pieces;  ///< they tile the tensor
  bool operator==(const TensorRecord& o) const {
    return shape == o.shape && dtype == o.dtype && axes == o.axes && pieces == o.pieces;
  }
};

struct Index {
  int64_t world_size = 1;
  std::map<std::string, TensorRecord> tensors;
  std::optional<std::pair<uint64_t, uint64_t>> rng;  ///< te::nn's RNG state: seed, calls
  std::string extra_json = "{}";                     ///< the caller's metadata, as JSON text
  /// Saved with an optimizer (whose state may still be empty: no step had a gradient yet).
  bool with_optimizer = false;
  bool operator==(const Index& o) const {
    return world_size == o.world_size && tensors == o.tensors && rng == o.rng &&
           extra_json == o.extra_json && with_optimizer == o.with_optimizer;
  }
};

/// Parses and checks an index read from `path`; `what` starts each message ("load_checkpoint").
Index parse_index(std::string_view text, const std::string& path, const char* what);
/// The index file's text: te-cpp's records, plus Hugging Face's metadata.total_size and, when
/// every tensor is one whole piece, its weight_map.
std::string index_text(const Index& index);

/// A piece one rank wrote, with its tensor's dtype: what rank 0 gathers to write the index.
struct RankPiece {
  std::string dtype;
  Piece piece;
};
std::string pieces_text(const std::map<std::string, RankPiece>& pieces);
std::map<std::string, RankPiece> parse_pieces(std::string_view text, const std::string& from);

}  // namespace te::nn::format
