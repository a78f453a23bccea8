#pragma once

// A checkpoint's files (checkpoint.cpp holds the collective protocol around them): writing one
// rank's pieces as a synced safetensors file with per-block CRC-32s, writing a small file whole,
// syncing a directory, and reading the part of a tensor's saved pieces that one rank needs.

#include <ATen/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_format.h"
#include "te/nn/safetensors.h"

namespace te::nn::io {

/// A piece of a tensor this rank writes: its data (contiguous, on the CPU) and where it sits in
/// the whole tensor.
struct OwnedPiece {
  std::string name;
  at::Tensor data;
  std::vector<int64_t> offsets;
};

/// Writes `owned` (in order) as one safetensors file at `path`, synced; returns the index record
/// of each piece (its file, offsets, shape and block checksums). te::Error naming the file when
/// a write fails (a full disk, a file-size limit): the save ends before anything is renamed.
std::map<std::string, format::RankPiece> write_safetensors(const std::vector<OwnedPiece>& owned,
                                                           const std::filesystem::path& path);

/// Writes `text` to `path` and syncs it; `what` names the caller in errors.
void write_file(const std::filesystem::path& path, const std::string& text, const char* what);

/// fsync of a file or a directory (te::Error naming it when it fails).
void fsync_path(const std::filesystem::path& path, bool directory);

/// Reads the box of tensor `name` at `offsets` with the shape of `filled` from the saved pieces
/// of record `t` (files under `root`, each opened once through `files`) into `filled`; returns
/// the elements covered. Every block read is checked against its CRC-32.
int64_t read_box(const std::string& name, const format::TensorRecord& t,
                 const std::vector<int64_t>& offsets, const std::filesystem::path& root,
                 at::Tensor& filled,
                 std::map<std::string, std::unique_ptr<SafetensorsReader>>& files,
                 int64_t* bytes_read);

}  // namespace te::nn::io
