#pragma once
// Runs an app as a user runs it, for the apps' tests: a child process with its stdout and
// stderr captured, and its exit status.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>
#include <vector>

#include <doctest/doctest.h>

namespace nerve::testing {

struct app_result {
  int exit_code = -1;  ///< -1 when killed by a signal
  std::string out, err;
};

/// Runs `args` (the program first) with stdout and stderr captured, both pipes drained to
/// the end (a chatty child never blocks on a full pipe). `on_stderr` sees all of stderr
/// so far each time more arrives, with the child's pid: a test reacts to what the app
/// says, never to time.
inline app_result run_app(const std::vector<std::string>& args,
                          const std::function<void(pid_t, const std::string&)>& on_stderr = {}) {
  int out[2], err[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  app_result r;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open = 2;
  char buf[4096];
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0) {
      REQUIRE(errno == EINTR);
      continue;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[k].fd);
        fds[k].fd = -1;
        --open;
        continue;
      }
      (k == 0 ? r.out : r.err).append(buf, std::size_t(n));
      if (k == 1 && on_stderr) on_stderr(pid, r.err);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace nerve::testing
