// Tests for the safetensors reader/writer and the checkpoint API: the byte
// layout, every validation error, atomic replacement (a failing writer and a
// killed writer leave the old file intact) and a round trip through PyTorch.

#include "layers/checkpoint/atomic_file.hpp"
#include "layers/checkpoint/checkpoint.hpp"
#include "layers/checkpoint/safetensors.hpp"
#include "tests/layers/common.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace nerve::checkpoint;
namespace fs = std::filesystem;

namespace {

using nerve::layers::testing::contains;

struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "nerve-st-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~temp_dir() { fs::remove_all(path); }
  std::size_t entries() const { return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), {})); }
};

std::vector<std::byte> slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

void spit(const fs::path& p, std::span<const std::byte> bytes) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A file from a header text and a buffer, with no checks: for building malformed files.
std::vector<std::byte> raw_file(const std::string& header, std::size_t buffer_bytes, std::uint64_t n_override = 0) {
  std::uint64_t n = n_override ? n_override : header.size();
  std::vector<std::byte> out(8 + header.size() + buffer_bytes, std::byte{0});
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

format_error parse_error(std::vector<std::byte> bytes) {
  try {
    safetensors_file::parse(std::move(bytes), "model.safetensors");
  } catch (const format_error& e) {
    return e;
  }
  FAIL("parse accepted a malformed file");
  return format_error("", 0, "");
}

std::string error_of(const std::string& header, std::size_t buffer_bytes) {
  return parse_error(raw_file(header, buffer_bytes)).what();
}

const std::vector<float> sample_weight = {1, 2, 3, 4, 5, 6};
const std::vector<float> sample_bias = {0.5f, -0.5f};
const std::vector<std::int64_t> sample_steps = {42};

std::vector<tensor_ref> sample_tensors() {
  return {f32_tensor("fc1.weight", {2, 3}, sample_weight), f32_tensor("fc1.bias", {2}, sample_bias),
          i64_tensor("bn.num_batches_tracked", {}, sample_steps)};
}

}  // namespace

TEST_SUITE("layers.safetensors") {
  TEST_CASE("the header is the published layout, padded to 8 bytes") {
    const std::vector<float> one = {1.0f, 2.0f};
    std::vector<tensor_ref> t = {f32_tensor("a", {2}, one)};
    auto bytes = encode_safetensors(t, {{"format", "pt"}});
    std::uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    CHECK(n % 8 == 0);
    std::string header(reinterpret_cast<const char*>(bytes.data() + 8), n);
    CHECK(header ==
          R"({"__metadata__":{"format":"pt"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]}})"
          "   ");  // 85 bytes of JSON + 3 spaces = 88
    CHECK(bytes.size() == 8 + n + 8);
    float back[2];
    std::memcpy(back, bytes.data() + 8 + n, 8);
    CHECK(back[1] == 2.0f);
  }

  TEST_CASE("tensors round-trip with dtype, shape, data and metadata") {
    const std::vector<double> d = {1e-300, 2.5};
    const std::vector<float> empty;
    auto t = sample_tensors();
    t.push_back(f64_tensor("x.f64", {2, 1}, d));
    t.push_back(f32_tensor("x.empty", {0, 3}, empty));
    auto f = safetensors_file::parse(encode_safetensors(t, {{"step", "7"}}), "mem");
    CHECK(f.metadata().at("step") == "7");
    CHECK(f.tensors().size() == 5);
    CHECK(f.buffer_offset() % 8 == 0);
    // Larger dtypes first, then by name: every tensor stays aligned to its element size.
    CHECK(f.tensors()[0].name == "bn.num_batches_tracked");
    CHECK(f.tensors()[1].name == "x.f64");
    for (auto& ti : f.tensors()) CHECK((f.buffer_offset() + ti.begin) % dtype_size(ti.type) == 0);
    auto& fw = f.at("fc1.weight");
    CHECK(fw.type == dtype::f32);
    CHECK(fw.shape == std::vector<std::uint64_t>{2, 3});
    CHECK(f.to_float(fw) == sample_weight);
    CHECK(f.to_int64(f.at("bn.num_batches_tracked")) == sample_steps);
    CHECK(f.at("bn.num_batches_tracked").shape.empty());
    auto fd = f.to_float(f.at("x.f64"));
    CHECK(fd[1] == 2.5f);
    CHECK(f.at("x.empty").elements() == 0);
    CHECK_THROWS_AS(f.at("nope"), std::out_of_range);
    CHECK_THROWS_AS(f.to_int64(fw), format_error);
  }

  TEST_CASE("F16 and BF16 convert to float") {
    const std::uint16_t h[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00};
    const std::uint16_t bf[] = {0x3F80, 0xC040};
    std::vector<tensor_ref> t = {{"h", dtype::f16, {6}, std::as_bytes(std::span(h))},
                                 {"bf", dtype::bf16, {2}, std::as_bytes(std::span(bf))}};
    auto f = safetensors_file::parse(encode_safetensors(t));
    auto hv = f.to_float(f.at("h"));
    CHECK(hv[0] == 1.0f);
    CHECK(hv[1] == -2.0f);
    CHECK(hv[2] == 65504.0f);
    CHECK(hv[3] == 5.9604644775390625e-8f);  // smallest subnormal, 2^-24
    CHECK(std::signbit(hv[4]));
    CHECK(std::isinf(hv[5]));
    auto bv = f.to_float(f.at("bf"));
    CHECK(bv == std::vector<float>{1.0f, -3.0f});
  }

  TEST_CASE("truncated files are errors, at every length") {
    auto full = encode_safetensors(sample_tensors());
    for (std::size_t len = 0; len < full.size(); ++len) {
      CAPTURE(len);
      auto e = parse_error(std::vector<std::byte>(full.begin(), full.begin() + static_cast<long>(len)));
      CHECK(e.file() == "model.safetensors");
    }
    CHECK(contains(parse_error({}).what(), "8-byte header size"));
  }

  TEST_CASE("single-byte corruptions never crash: an error or a valid file") {
    auto full = encode_safetensors(sample_tensors());
    for (std::size_t i = 0; i < full.size(); ++i) {
      for (std::uint8_t x : {0x00, 0x01, 0x22, 0x5d, 0xff}) {
        auto bytes = full;
        bytes[i] = std::byte{x};
        try {
          safetensors_file::parse(std::move(bytes));
        } catch (const format_error&) {
        }
      }
    }
  }

  TEST_CASE("header sizes: oversize and past the end of the file") {
    auto e = parse_error(raw_file("{}", 0, 100'000'001));
    CHECK(e.offset() == 0);
    CHECK(contains(e.what(), "over the limit"));
    auto e2 = parse_error(raw_file("{}", 0, 3));
    CHECK(contains(e2.what(), "runs past the end of the file"));
  }

  TEST_CASE("the header must be a JSON object") {
    CHECK(contains(error_of("{\"a\": ", 0), "not valid JSON"));
    CHECK(contains(error_of("[1, 2]", 0), "does not start with '{'"));
    CHECK(contains(error_of(" {}", 0), "does not start with '{'"));
    CHECK(contains(error_of("{\"a\":\"\xff\"}", 0), "not valid JSON"));  // invalid UTF-8
    CHECK(contains(error_of("{\"a\":1e400}", 0), "number overflow"));  // found by fuzzing: not a parse_error
    auto e = parse_error(raw_file("{\"a\": [1,}", 0));
    CHECK(e.offset() >= 8);
    CHECK(contains(e.what(), "model.safetensors: at byte"));
    CHECK_NOTHROW(safetensors_file::parse(raw_file("{}      ", 0)));
  }

  TEST_CASE("tensor entries are validated, naming the tensor") {
    const std::string ok = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
    CHECK_NOTHROW(safetensors_file::parse(raw_file("{\"t\":{" + ok + "}}", 8)));
    SUBCASE("unknown dtype") {
      auto m = error_of(R"({"t":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8);
      CHECK(contains(m, "tensor 't': unknown dtype 'F31'"));
    }
    SUBCASE("shape and byte count disagree") {
      auto m = error_of(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
      CHECK(contains(m, "tensor 't': shape [3] of F32 needs 12 bytes, data_offsets [0, 8] hold 8"));
    }
    SUBCASE("shape that overflows") {
      auto m = error_of(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8);
      CHECK(contains(m, "more than 2^64"));
    }
    SUBCASE("negative or fractional dimensions") {
      CHECK(contains(error_of(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative"));
      CHECK(contains(error_of(R"({"t":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), "non-negative"));
    }
    SUBCASE("offsets past the buffer") {
      auto m = error_of(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
      CHECK(contains(m, "run past the end of the 4-byte buffer"));
    }
    SUBCASE("offsets reversed") {
      CHECK(contains(error_of(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "end before"));
    }
    SUBCASE("missing and unknown fields") {
      CHECK(contains(error_of(R"({"t":{"dtype":"F32","shape":[2]}})", 8), "data_offsets is not a pair"));
      CHECK(contains(error_of(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8), "no dtype"));
      CHECK(contains(error_of(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8), "no shape"));
      CHECK(contains(error_of("{\"t\":{" + ok + ",\"extra\":1}}", 8), "unknown field 'extra'"));
      CHECK(contains(error_of(R"({"t":[1]})", 8), "tensor 't': its entry is not an object"));
    }
    SUBCASE("metadata must map strings to strings") {
      CHECK(contains(error_of(R"({"__metadata__":{"a":1}})", 0), "'a' is not a string"));
      CHECK(contains(error_of(R"({"__metadata__":[]})", 0), "__metadata__ is not an object"));
    }
    SUBCASE("duplicate names") {
      auto m = error_of("{\"t\":{" + ok + "},\"t\":{" + ok + "}}", 8);
      CHECK(contains(m, "the key 't' twice"));
    }
  }

  TEST_CASE("the tensors must tile the buffer: no overlap, no hole, nothing left over") {
    SUBCASE("overlap") {
      auto m = error_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        12);
      CHECK(contains(m, "tensor 'b': data_offsets [4, 12] overlap tensor 'a'"));
    }
    SUBCASE("hole") {
      auto e = parse_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                    12));
      CHECK(contains(e.what(), "leave a hole of 4 bytes after tensor 'a'"));
    }
    SUBCASE("bytes left over") {
      auto m = error_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6);
      CHECK(contains(m, "2 bytes after the last tensor"));
    }
    SUBCASE("no tensors but a buffer") { CHECK(contains(error_of("{}", 3), "3 bytes after the last tensor")); }
  }

  TEST_CASE("the writer rejects inconsistent input before touching the disk") {
    temp_dir dir;
    std::vector<tensor_ref> dup = {f32_tensor("a", {2}, sample_bias), f32_tensor("a", {2}, sample_bias)};
    CHECK_THROWS_AS(write_safetensors(dir.path / "x.safetensors", dup), std::invalid_argument);
    std::vector<tensor_ref> bad = {f32_tensor("a", {3}, sample_bias)};
    CHECK_THROWS_AS(write_safetensors(dir.path / "x.safetensors", bad), std::invalid_argument);
    std::vector<tensor_ref> reserved = {f32_tensor("__metadata__", {2}, sample_bias)};
    CHECK_THROWS_AS(encode_header(reserved), std::invalid_argument);
    CHECK(dir.entries() == 0);
  }

  TEST_CASE("a failing write leaves the previous checkpoint intact and no temporary behind") {
    temp_dir dir;
    const fs::path target = dir.path / "model.safetensors";
    write_safetensors(target, sample_tensors(), {{"version", "old"}});
    const auto old_bytes = slurp(target);

    std::vector<float> big(100000, 3.0f);
    std::vector<tensor_ref> next = {f32_tensor("fc1.weight", {1000, 100}, big)};
    write_options opt;
    opt.chunk_bytes = 4096;
    std::uint64_t seen = 0;
    opt.on_progress = [&](std::uint64_t written) {
      seen = written;
      if (written > 200000) throw std::runtime_error("injected failure");
    };
    CHECK_THROWS_WITH_AS(write_safetensors(target, next, {}, opt), "injected failure", std::runtime_error);
    CHECK(seen > 200000);
    CHECK(seen < 400000);  // it really was midway
    CHECK(slurp(target) == old_bytes);
    CHECK(safetensors_file::read(target).metadata().at("version") == "old");
    CHECK(dir.entries() == 1);

    // And a write that completes replaces it.
    write_safetensors(target, next);
    CHECK(safetensors_file::read(target).at("fc1.weight").shape == std::vector<std::uint64_t>{1000, 100});
    CHECK(dir.entries() == 1);
  }

  TEST_CASE("a writer killed midway leaves the previous checkpoint intact") {
    temp_dir dir;
    const fs::path target = dir.path / "model.safetensors";
    write_safetensors(target, sample_tensors(), {{"version", "old"}});
    const auto old_bytes = slurp(target);

    int ready[2], hold[2];
    REQUIRE(::pipe(ready) == 0);
    REQUIRE(::pipe(hold) == 0);
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // The child writes a new checkpoint; halfway it tells the parent and blocks
      // until it is killed (the parent never writes to `hold`).
      ::close(ready[0]);
      ::close(hold[1]);
      std::vector<float> big(100000, 7.0f);
      std::vector<tensor_ref> next = {f32_tensor("fc1.weight", {1000, 100}, big)};
      write_options opt;
      opt.chunk_bytes = 4096;
      opt.on_progress = [&](std::uint64_t written) {
        if (written > 200000) {
          char c = 'x';
          (void)!::write(ready[1], &c, 1);
          (void)!::read(hold[0], &c, 1);
          ::_exit(3);  // only if the parent died without killing us
        }
      };
      try {
        write_safetensors(target, next, {}, opt);
      } catch (...) {
      }
      ::_exit(2);
    }
    ::close(ready[1]);
    ::close(hold[0]);
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::kill(child, SIGKILL);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    ::close(ready[0]);
    ::close(hold[1]);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    CHECK(slurp(target) == old_bytes);
    CHECK(safetensors_file::read(target).metadata().at("version") == "old");
    // The killed writer's partial temporary stays beside it, hidden and harmless.
    std::size_t temps = 0;
    for (auto& e : fs::directory_iterator(dir.path)) {
      if (e.path() == target) continue;
      CHECK(e.path().filename().string().rfind(".model.safetensors.tmp-", 0) == 0);
      CHECK(e.file_size() > 200000);
      ++temps;
    }
    CHECK(temps == 1);
  }

  TEST_CASE("I/O errors name the file") {
    temp_dir dir;
    try {
      write_safetensors(dir.path / "no-such-dir" / "m.safetensors", sample_tensors());
      FAIL("no error");
    } catch (const std::invalid_argument& e) {  // a path the user got wrong, like a FIFO
      CHECK(contains(e.what(), "the directory '" + (dir.path / "no-such-dir").string() + "' does not exist"));
    }
    try {
      safetensors_file::read(dir.path / "missing.safetensors");
      FAIL("no error");
    } catch (const std::system_error& e) {
      CHECK(contains(e.what(), "missing.safetensors"));
    }
    spit(dir.path / "bad.safetensors", raw_file("{\"x\":1}", 0));
    try {
      safetensors_file::read(dir.path / "bad.safetensors");
      FAIL("no error");
    } catch (const format_error& e) {
      CHECK(contains(e.what(), (dir.path / "bad.safetensors").string() + ": at byte 8: tensor 'x'"));
    }
  }
}

TEST_SUITE("layers.checkpoint") {
  TEST_CASE("a state dict round-trips through a file") {
    temp_dir dir;
    state_dict sd;
    sd.add("fc1.weight", {2, 3}, sample_weight);
    sd.add("fc1.bias", {2}, sample_bias);
    sd.add_int64("bn.num_batches_tracked", {}, sample_steps);
    sd.metadata["model"] = "tiny";
    save_checkpoint(dir.path / "c.safetensors", sd);
    auto back = load_checkpoint(dir.path / "c.safetensors");
    CHECK(back.names() == sd.names());
    CHECK(back.metadata.at("model") == "tiny");
    const std::size_t wshape[] = {2, 3};
    auto wv = back.floats("fc1.weight", wshape);
    CHECK(std::vector<float>(wv.begin(), wv.end()) == sample_weight);
    CHECK(back.at("bn.num_batches_tracked").ints == sample_steps);
    std::vector<float> dst(6);
    back.copy_to("fc1.weight", wshape, dst);
    CHECK(dst == sample_weight);
    CHECK_THROWS_AS(sd.add("x", {2, 2}, {1.0f}), std::invalid_argument);
  }

  TEST_CASE("shape and name mismatches name the file, the tensor and both shapes") {
    temp_dir dir;
    state_dict sd;
    sd.add("fc1.weight", {2, 3}, sample_weight);
    sd.add("fc1.bias", {2}, sample_bias);
    save_checkpoint(dir.path / "c.safetensors", sd);
    auto back = load_checkpoint(dir.path / "c.safetensors");
    const std::size_t transposed[] = {3, 2};
    try {
      back.floats("fc1.weight", transposed);
      FAIL("no error");
    } catch (const std::runtime_error& e) {
      CHECK(contains(e.what(), "c.safetensors: tensor 'fc1.weight' has shape [2, 3], the model expects [3, 2]"));
    }
    std::vector<std::string> expected = {"fc1.weight", "fc2.weight"};
    try {
      back.check_names(expected);
      FAIL("no error");
    } catch (const std::runtime_error& e) {
      CHECK(contains(e.what(), "missing 'fc2.weight'"));
      CHECK(contains(e.what(), "unexpected 'fc1.bias'"));
    }
    std::vector<std::string> exact = {"fc1.bias", "fc1.weight"};
    CHECK_NOTHROW(back.check_names(exact));
  }

  TEST_CASE("a checkpoint loads into PyTorch and PyTorch's state dict loads back") {
    // Debian's python3-torch lives in /usr/bin/python3; another python3 may come first on PATH.
    std::string python;
    for (const char* p : {"/usr/bin/python3", "python3"}) {
      if (std::system((std::string(p) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0) {
        python = p;
        break;
      }
    }
    if (python.empty()) {
      MESSAGE("python3-torch is not installed; skipping the PyTorch round trip");
      return;
    }
    temp_dir dir;
    state_dict sd;
    // fc1 = Linear(3, 4): weight out x in = 4 x 3; fc2 = Linear(4, 2).
    std::vector<float> w1(12), b1(4), w2(8), b2(2), x(15);
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = 0.1f * static_cast<float>(i) - 0.5f;
    for (std::size_t i = 0; i < b1.size(); ++i) b1[i] = 0.05f * static_cast<float>(i);
    for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = 0.3f - 0.07f * static_cast<float>(i);
    b2 = {0.25f, -0.125f};
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
    sd.add("fc1.weight", {4, 3}, w1);
    sd.add("fc1.bias", {4}, b1);
    sd.add("fc2.weight", {2, 4}, w2);
    sd.add("fc2.bias", {2}, b2);
    sd.add("bn.weight", {4}, {1, 1, 1, 1});
    sd.add("bn.bias", {4}, {0, 0, 0, 0});
    sd.add("bn.running_mean", {4}, {0.5f, 0, 0, 0});
    sd.add("bn.running_var", {4}, {1, 1, 2, 1});
    sd.add_int64("bn.num_batches_tracked", {}, {17});
    sd.add("probe.x", {5, 3}, x);
    sd.metadata["model"] = "probe-net";
    const fs::path in = dir.path / "nerve.safetensors", out = dir.path / "torch.safetensors";
    save_checkpoint(in, sd);
    const std::string script = std::string(NERVE_SOURCE_DIR) + "/tests/layers/fixtures/torch_checkpoint_roundtrip.py";
    int rc = std::system((python + " " + script + " " + in.string() + " " + out.string()).c_str());
    REQUIRE(rc == 0);

    auto back = load_checkpoint(out);
    CHECK(back.metadata.at("seen") == "probe-net");
    CHECK(contains(back.metadata.at("written_by"), "torch"));
    std::vector<std::string> names = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "bn.weight", "bn.bias",
                                      "bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "probe.y"};
    back.check_names(names);
    // Every float parameter came back through PyTorch plus one, in the same layout.
    for (const auto& [name, t] : sd.tensors()) {
      if (name == "probe.x" || t.is_integer) continue;
      CAPTURE(name);
      auto got = back.floats(name, t.shape);
      for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == t.floats[i] + 1.0f);
    }
    CHECK(back.at("bn.num_batches_tracked").ints == std::vector<std::int64_t>{17});
    // PyTorch's forward with our weights equals ours with out x in row-major weights.
    const std::size_t yshape[] = {5, 2};
    auto y = back.floats("probe.y", yshape);
    for (std::size_t r = 0; r < 5; ++r) {
      double h[4];
      for (std::size_t o = 0; o < 4; ++o) {
        double s = b1[o];
        for (std::size_t i = 0; i < 3; ++i) s += double(w1[o * 3 + i]) * x[r * 3 + i];
        h[o] = s > 0 ? s : 0;
      }
      for (std::size_t o = 0; o < 2; ++o) {
        double s = b2[o];
        for (std::size_t i = 0; i < 4; ++i) s += double(w2[o * 4 + i]) * h[i];
        CHECK(y[r * 2 + o] == doctest::Approx(s).epsilon(1e-5));
      }
    }
  }
}
