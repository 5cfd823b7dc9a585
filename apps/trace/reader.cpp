#include "apps/trace/reader.hpp"

#include "apps/trace/detail/reader.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace nerve::trace {

timeline read_trace_text(std::string_view text, const std::string& file, diagnostics& diags) {
  return detail::reader(file, diags).read(text);
}

timeline read_trace_file(const std::string& path, diagnostics& diags) {
  auto fail = [&](const std::string& why) {
    diags.error(path, -1, why);
    timeline t;
    t.files.push_back({path, false, {}});
    return t;
  };
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (status.type() == std::filesystem::file_type::not_found) return fail("cannot open the file: no such file");
  if (status.type() == std::filesystem::file_type::directory) return fail("cannot read it: it is a directory, not a trace file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::string("cannot open the file: ") + std::strerror(errno));
  // A read error (an unreadable device, an I/O error) throws from inside the stream
  // buffer in libstdc++; turn it into the same kind of error as the rest.
  std::string text;
  try {
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure& e) {
    return fail(std::string("cannot read the file: ") + e.what());
  }
  if (in.bad()) return fail("cannot read the file: an I/O error");
  return read_trace_text(text, path, diags);
}

timeline read_trace_files(const std::vector<std::string>& paths, diagnostics& diags) {
  timeline all;
  for (const auto& p : paths) all.append(read_trace_file(p, diags));
  return all;
}

}  // namespace nerve::trace
