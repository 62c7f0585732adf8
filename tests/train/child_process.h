// The darkformer binary as a child process, for the tests that signal or kill it.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace darkformer {

inline std::string Binary() {
  const char* dir = std::getenv("DARKFORMER_BINARY_DIR");
  return std::string(dir ? dir : DARKFORMER_TEST_BINARY_DIR) + "/darkformer";
}

// Starts `darkformer train --config <config> [--set ...]` with stdout and stderr to `log`.
inline pid_t StartTrain(const std::string& config, const std::string& log, const std::vector<std::string>& sets = {}) {
  std::vector<std::string> args = {Binary(), "train", "--config", config};
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {  // only async-signal-safe calls between fork and exec
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Waits for the child; returns its exit code, or 128 + signal if a signal ended it.
inline int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace darkformer
