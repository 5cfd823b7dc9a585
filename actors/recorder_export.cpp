// What leaves the recorder: its records as Chrome trace JSON (`recorder::to_chrome_trace`,
// docs/trace-format.md) and a file written atomically (`recorder::write_file`,
// `write_file_atomically`).
#include "actors/recorder.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace nerve::actors {

namespace {
double us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }
std::string kind_of(const record& r) {
  if (r.name) return r.name;
  if (r.tag) return std::string(r.tag->name);
  return "message";
}
}  // namespace

nlohmann::json recorder::to_chrome_trace(const nlohmann::json& actors, const nlohmann::json& extra) const {
  using nlohmann::json;
  json events = json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "nerve rank 0"}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", 0}, {"args", {{"name", "outside"}}}});
  if (actors.is_array()) {
    for (const auto& a : actors) {
      auto id = a.value("id", 0);
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", id}, {"args", {{"name", a.value("name", "")}}}});
      // Lanes group by loop, then stage, then spawn order.
      long sort = (a.value("loop", 0) + 1) * 100000000L + (a.value("stage", -1) + 1) * 1000000L + id;
      events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", id}, {"args", {{"sort_index", sort}}}});
    }
  }
  {
    std::lock_guard lk(mu_);
    for (const auto& t : tracks_) {
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 0}, {"tid", t.track}, {"args", {{"name", t.name}}}});
      if (t.sort_index >= 0)
        events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 0}, {"tid", t.track},
                          {"args", {{"sort_index", t.sort_index}}}});
    }
  }
  for (const auto& r : snapshot()) {
    const auto name = kind_of(r);
    switch (r.kind) {
      case record_kind::send:
        events.push_back({{"ph", "s"}, {"cat", "msg"}, {"name", name}, {"id", r.flow}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"args", {{"bytes", r.bytes}, {"mb", r.mb}, {"to", r.peer}}}});
        if (r.depth >= 0)
          events.push_back({{"ph", "C"}, {"cat", "mailbox"}, {"name", "mailbox"}, {"pid", 0}, {"tid", r.peer},
                            {"ts", us(r.ts_ns)}, {"args", {{"depth", r.depth}}}});
        break;
      case record_kind::handle:
        events.push_back({{"ph", "X"}, {"cat", "handler"}, {"name", name}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"dur", us(r.dur_ns)},
                          {"args", {{"loop", r.aux}, {"mb", r.mb}, {"bytes", r.bytes}, {"queue_us", us(r.value)},
                                    {"sender", r.peer}}}});
        if (r.aux2 > 1) events.back()["args"]["shared"] = r.aux2;
        if (r.flow)
          events.push_back({{"ph", "f"}, {"bp", "e"}, {"cat", "msg"}, {"name", name}, {"id", r.flow}, {"pid", 0},
                            {"tid", r.track}, {"ts", us(r.ts_ns)}});
        break;
      case record_kind::drop:
        events.push_back({{"ph", "i"}, {"s", "t"}, {"cat", "drop"}, {"name", name}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"args", {{"to", r.peer}, {"reason", r.text ? r.text : "closed"}}}});
        break;
      case record_kind::failure:
        events.push_back({{"ph", "i"}, {"s", "t"}, {"cat", "failure"}, {"name", "failure"}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{"what", name}}}});
        break;
      case record_kind::span: {
        json args = {{"mb", r.mb}};
        std::string cat = r.cat ? r.cat : "span";
        if (cat == "idle") args["cause"] = r.text ? r.text : "input";
        else if (cat == "action") args.update({{"chunk", r.value}, {"stage", r.aux}, {"step", r.aux2}});
        else if (cat == "step") args = {{"step", r.value}};
        else if (cat == "evaluation") args = {{"epoch", r.value}};
        else if (cat == "gpu") args.update({{"stream", r.aux}, {"device", r.aux2}});
        else if (r.text) args["text"] = r.text;
        events.push_back({{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 0}, {"tid", r.track},
                          {"ts", us(r.ts_ns)}, {"dur", us(r.dur_ns)}, {"args", std::move(args)}});
        break;
      }
      case record_kind::instant:
        events.push_back({{"ph", "i"}, {"s", "t"}, {"cat", r.cat ? r.cat : "instant"}, {"name", name}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{"mb", r.mb}}}});
        break;
      case record_kind::flow_start:
        if (r.flow == 0) break;  // a bound flow's place holder (bound_flow)
        events.push_back({{"ph", "s"}, {"cat", r.cat ? r.cat : "msg"}, {"name", name}, {"id", r.flow}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}});
        break;
      case record_kind::flow_end:
        if (r.flow == 0) break;
        events.push_back({{"ph", "f"}, {"bp", "e"}, {"cat", r.cat ? r.cat : "msg"}, {"name", name}, {"id", r.flow},
                          {"pid", 0}, {"tid", r.track}, {"ts", us(r.ts_ns)}});
        break;
      case record_kind::counter:
        events.push_back({{"ph", "C"}, {"cat", r.text ? r.text : "counter"}, {"name", name}, {"pid", 0},
                          {"tid", r.track}, {"ts", us(r.ts_ns)}, {"args", {{r.text ? r.text : "value", r.value}}}});
        if (r.aux >= 0) events.back()["id"] = r.aux;
        break;
    }
  }
  json nerve = {{"version", 1}, {"actors", actors.is_array() ? actors : json::array()}, {"lost_records", lost()}};
  if (extra.is_object()) nerve.update(extra);
  return {{"displayTimeUnit", "ns"}, {"traceEvents", std::move(events)}, {"nerve", std::move(nerve)}};
}

void recorder::write_file(const std::string& path, const nlohmann::json& actors, const nlohmann::json& extra) const {
  write_file_atomically(path, to_chrome_trace(actors, extra).dump());
}

void write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  // The same rules as a checkpoint's atomic_file (layers/checkpoint, which actors/ cannot
  // use): follow symlinks to the file they name, replace only a regular file and keep its
  // permission bits, and leave no temporary behind when a write fails (a full disk).
  auto fail = [&](const std::string& why, int err) {
    throw std::runtime_error(std::string(what) + " '" + path + "': " + why + (err ? std::string(": ") + std::strerror(err) : ""));
  };
  std::filesystem::path target = path;
  struct stat old {};
  bool replacing = false;
  for (int hops = 0;; ++hops) {
    if (::lstat(target.c_str(), &old) != 0) {
      if (errno != ENOENT) fail("cannot inspect " + target.string(), errno);
      break;
    }
    if (S_ISLNK(old.st_mode)) {
      if (hops == 40) fail("more than 40 symlinks in a row (a loop?)", 0);
      const auto link = std::filesystem::read_symlink(target);
      target = link.is_absolute() ? link : target.parent_path() / link;
      continue;
    }
    if (!S_ISREG(old.st_mode)) {
      const char* kind = S_ISDIR(old.st_mode)    ? "a directory"
                         : S_ISFIFO(old.st_mode) ? "a FIFO"
                         : S_ISCHR(old.st_mode)  ? "a character device"
                         : S_ISBLK(old.st_mode)  ? "a block device"
                         : S_ISSOCK(old.st_mode) ? "a socket"
                                                 : "something";
      fail((target.string() == path ? std::string() : "leads to '" + target.string() + "', which ") + "is " + kind +
               ", not a regular file: refusing to replace it",
           0);
    }
    replacing = true;
    break;
  }
  static std::atomic<unsigned> counter{0};
  std::string name(1, '.');  // appended piece by piece: "." + std::string trips GCC 12's -Wrestrict (bug 105329)
  name += target.filename().string();
  name += ".tmp-";
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(counter++);
  const auto tmp = target.parent_path() / name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot create " + tmp.string(), errno);
  auto abandon = [&](const std::string& why) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    fail(why, err);
  };
  if (replacing && ::fchmod(fd, old.st_mode & 07777) != 0) abandon("cannot set the mode of " + tmp.string());
  for (std::size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) abandon("error writing " + tmp.string());
    at += static_cast<std::size_t>(n);
  }
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) abandon("error writing " + tmp.string());
  if (std::rename(tmp.c_str(), target.c_str()) != 0) abandon("cannot rename " + tmp.string() + " over it");
}

}  // namespace nerve::actors
