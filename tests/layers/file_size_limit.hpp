#pragma once
// A full disk on demand, for the tests of what a failed write leaves behind.
#include <signal.h>
#include <sys/resource.h>

#include <doctest/doctest.h>

namespace nerve::test {

/// A deterministic full disk: files may not grow past `bytes` (RLIMIT_FSIZE), and the
/// write fails with EFBIG instead of the process dying of SIGXFSZ. Restored on leaving.
struct file_size_limit {
  rlimit old{};
  struct sigaction old_action {};
  explicit file_size_limit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGXFSZ, &ignore, &old_action);
    rlimit lim = old;
    lim.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::sigaction(SIGXFSZ, &old_action, nullptr);
  }
};

}  // namespace nerve::test
