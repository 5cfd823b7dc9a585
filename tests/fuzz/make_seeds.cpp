// Writes small valid inputs for the fuzzers into DIR/idx and DIR/safetensors, so a
// run starts from the formats' shapes rather than from nothing. Generated at run time
// by scripts/fuzz: the tree holds no corpus.

#include "layers/checkpoint/safetensors.hpp"
#include "layers/data/idx.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {
void put(const std::filesystem::path& p, std::span<const std::byte> bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  namespace fs = std::filesystem;
  using namespace nerve;
  const fs::path dir = argv[1];
  fs::create_directories(dir / "idx");
  fs::create_directories(dir / "safetensors");

  std::vector<std::size_t> s2{2, 3}, s1{4}, s3{2, 2, 2};
  std::vector<std::uint8_t> u8{0, 1, 2, 254, 255, 9};
  std::vector<std::int16_t> i16{-1, 2, 300, -400};
  std::vector<float> f32{0.5f, -1.0f, 2.0f, 1e9f, 0, 0, 0, 1};
  std::vector<double> f64{1.0, -2.0, 3.5, 4.0};
  auto a = data::encode_idx<std::uint8_t>(s2, u8);
  auto b = data::encode_idx<std::int16_t>(s1, i16);
  auto c = data::encode_idx<float>(s3, f32);
  auto d = data::encode_idx<double>(s1, f64);
  put(dir / "idx" / "u8", a);
  put(dir / "idx" / "i16", b);
  put(dir / "idx" / "f32", c);
  put(dir / "idx" / "f64", d);
  put(dir / "idx" / "u8.gz", data::gzip_compress(a));
  put(dir / "idx" / "f32.gz", data::gzip_compress(c, 1));

  using namespace nerve::checkpoint;
  std::vector<std::int64_t> steps{3};
  std::vector<std::uint16_t> half{0x3c00, 0x0001};
  std::vector<tensor_ref> one = {f32_tensor("fc1.weight", {2, 4}, f32), f32_tensor("fc1.bias", {2}, std::span(f32).first(2)),
                                 i64_tensor("bn.num_batches_tracked", {}, steps)};
  put(dir / "safetensors" / "mlp", encode_safetensors(one, {{"format", "pt"}}));
  std::vector<tensor_ref> two = {f64_tensor("x", {2, 2}, f64),
                                 tensor_ref{"h", dtype::f16, {2}, std::as_bytes(std::span(half))},
                                 f32_tensor("empty", {0}, std::span<const float>())};
  put(dir / "safetensors" / "mixed", encode_safetensors(two));
  put(dir / "safetensors" / "none", encode_safetensors({}));
  return 0;
}
