// GGUF's writer (see gguf_write.h). The layout (ggml's docs/gguf.md): "GGUF", version u32,
// tensor count u64, metadata count u64; each key/value (a string key: u64 length and bytes; a
// u32 value type; the value, an array as element type u32, count u64, elements); each tensor's
// info (name, dims u32, each dim u64 innermost first, type u32, data offset u64); padding to the
// alignment; the data, each tensor aligned.

#include "gguf_write.h"

#include <ATen/ATen.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "te/error.h"

namespace te::hf::detail {

namespace {

class Out {
 public:
  explicit Out(std::ofstream& f) : f_(f) {}
  template <typename T>
  void pod(T v) {
    f_.write(reinterpret_cast<const char*>(&v), sizeof(T));
    at_ += sizeof(T);
  }
  void bytes(const void* p, std::size_t n) {
    f_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    at_ += n;
  }
  void string(const std::string& s) {
    pod<uint64_t>(s.size());
    bytes(s.data(), s.size());
  }
  void pad_to(uint64_t alignment) {
    static const char zeros[64] = {};
    while (at_ % alignment != 0) bytes(zeros, std::min<uint64_t>(64, alignment - at_ % alignment));
  }
  uint64_t at() const { return at_; }

 private:
  std::ofstream& f_;
  uint64_t at_ = 0;
};

// One scalar of GGUF value type `type` (not a string or an array).
void scalar(Out& o, uint32_t type, int64_t i, double d, const std::string& key) {
  switch (type) {
    case 0:
      return o.pod<uint8_t>(static_cast<uint8_t>(i));
    case 1:
      return o.pod<int8_t>(static_cast<int8_t>(i));
    case 2:
      return o.pod<uint16_t>(static_cast<uint16_t>(i));
    case 3:
      return o.pod<int16_t>(static_cast<int16_t>(i));
    case 4:
      return o.pod<uint32_t>(static_cast<uint32_t>(i));
    case 5:
      return o.pod<int32_t>(static_cast<int32_t>(i));
    case 6:
      return o.pod<float>(static_cast<float>(d));
    case 7:
      return o.pod<uint8_t>(i != 0 ? 1 : 0);
    case 10:
      return o.pod<uint64_t>(static_cast<uint64_t>(i));
    case 11:
      return o.pod<int64_t>(i);
    case 12:
      return o.pod<double>(d);
    default:
      TE_FAIL("write_gguf: metadata '", key, "' has value type ", type, ", not a scalar");
  }
}

bool is_float_type(uint32_t type) { return type == 6 || type == 12; }

void value(Out& o, const std::string& key, const GgufValue& v) {
  o.pod<uint32_t>(v.type);
  if (v.type == 8) return o.string(v.string);
  if (v.type != 9) return scalar(o, v.type, v.integer, v.number, key);
  o.pod<uint32_t>(v.element_type);
  if (v.element_type == 8) {
    o.pod<uint64_t>(v.strings.size());
    for (const std::string& s : v.strings) o.string(s);
  } else if (is_float_type(v.element_type)) {
    o.pod<uint64_t>(v.numbers.size());
    for (double d : v.numbers) scalar(o, v.element_type, 0, d, key);
  } else {
    o.pod<uint64_t>(v.integers.size());
    for (int64_t i : v.integers) scalar(o, v.element_type, i, 0, key);
  }
}

// Q8_0 blocks of 32: an fp16 scale d = max |x| / 127 and the int8 round(x / d) (ggml's
// quantize_row_q8_0_ref: x * (1 / d), rounded half away from zero).
std::vector<uint8_t> q8_0(const at::Tensor& x, const std::string& name) {
  const at::Tensor f = x.to(at::kFloat).contiguous();
  TE_CHECK(f.dim() >= 1 && f.size(-1) % 32 == 0, "write_gguf: '", name, "' has rows of ",
           f.dim() ? f.size(-1) : 0, " values, not whole Q8_0 blocks of 32");
  const float* p = f.data_ptr<float>();
  const int64_t blocks = f.numel() / 32;
  std::vector<uint8_t> out(static_cast<std::size_t>(blocks) * 34);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = p + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* block = out.data() + b * 34;
    const uint16_t half = c10::Half(d).x;
    std::memcpy(block, &half, 2);
    for (int i = 0; i < 32; ++i)
      block[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(v[i] * id)));
  }
  return out;
}

std::vector<uint8_t> encode(const GgufOutTensor& t) {
  at::Tensor c;
  switch (t.type) {
    case GgmlType::kQ8_0:
      return q8_0(t.values, t.name);
    case GgmlType::kF32:
      c = t.values.to(at::kFloat);
      break;
    case GgmlType::kF16:
      c = t.values.to(at::kHalf);
      break;
    case GgmlType::kBF16:
      c = t.values.to(at::kBFloat16);
      break;
    default:
      TE_FAIL("write_gguf: '", t.name, "' as ggml type ", static_cast<uint32_t>(t.type),
              "; te-cpp writes F32, F16, BF16 and Q8_0");
  }
  c = c.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * c.element_size());
}

}  // namespace

void write_gguf(const std::string& path, const std::map<std::string, GgufValue>& metadata,
                const std::vector<GgufOutTensor>& tensors) {
  uint64_t alignment = 32;
  const auto a = metadata.find("general.alignment");
  if (a != metadata.end() && a->second.integer > 0)
    alignment = static_cast<uint64_t>(a->second.integer);
  std::vector<std::vector<uint8_t>> data;
  for (const GgufOutTensor& t : tensors) data.push_back(encode(t));
  const std::string tmp = path + ".writing";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TE_CHECK(f.good(), "write_gguf: cannot write '", tmp, "'");
    Out o(f);
    o.bytes("GGUF", 4);
    o.pod<uint32_t>(3);
    o.pod<uint64_t>(tensors.size());
    o.pod<uint64_t>(metadata.size());
    for (const auto& [key, v] : metadata) {
      o.string(key);
      value(o, key, v);
    }
    uint64_t offset = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      o.string(tensors[i].name);
      const at::Tensor& v = tensors[i].values;
      o.pod<uint32_t>(static_cast<uint32_t>(v.dim()));
      for (int64_t d = v.dim() - 1; d >= 0; --d) o.pod<uint64_t>(static_cast<uint64_t>(v.size(d)));
      o.pod<uint32_t>(static_cast<uint32_t>(tensors[i].type));
      o.pod<uint64_t>(offset);
      offset += (data[i].size() + alignment - 1) / alignment * alignment;
    }
    o.pad_to(alignment);
    for (const auto& d : data) {
      o.bytes(d.data(), d.size());
      o.pad_to(alignment);
    }
    f.flush();
    TE_CHECK(f.good(), "write_gguf: writing '", tmp, "' failed (a full disk?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace te::hf::detail
