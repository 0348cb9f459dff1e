// oam_process.h - a child process with pipes on stdin/stdout/stderr (engine-agnostic, C++17).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace oam {

struct SpawnOptions {
    std::vector<std::string> argv;  // argv[0] is looked up on PATH
    std::string workingDirectory;   // empty: inherit
    // The child dies with the spawning thread, even when the game is killed with SIGKILL (Linux:
    // PR_SET_PDEATHSIG; so spawn from a thread that lives as long as the bridge should, e.g. the
    // game thread). Windows: a job object kills it when the game's handle to the job closes.
    // Everywhere: the bridge also exits on stdin EOF, which a dead game causes.
    bool dieWithParent = true;
};

// Splits a command line on whitespace; single and double quotes group, backslash escapes.
std::vector<std::string> splitCommandLine(std::string_view command);

// Owns the child and the parent's ends of its three pipes (all close-on-exec / not inherited).
// Threading: write()/closeStdin() from one thread, readStdout() from one, readStderr() from
// one; waitFor()/terminate()/kill() from any. The destructor kills and reaps a child that is
// still running, so join the threads that use it first.
class Process {
public:
    static std::unique_ptr<Process> spawn(const SpawnOptions& options);  // throws std::system_error
    ~Process();
    Process(const Process&) = delete;
    Process& operator=(const Process&) = delete;

    // Writes every byte; false when the child closed its stdin (EPIPE, no SIGPIPE) or on error.
    bool write(std::string_view data);
    void closeStdin();
    // Blocking reads: bytes read, 0 at end of stream, -1 on error.
    long readStdout(char* buffer, std::size_t size);
    long readStderr(char* buffer, std::size_t size);

    // Exit status once the child has exited (128 + signal number when a signal ended it),
    // nullopt when it is still running after timeout.
    std::optional<int> waitFor(std::chrono::milliseconds timeout);
    void terminate();  // polite: SIGTERM to the child's process group (Windows: TerminateProcess)
    void kill();       // SIGKILL to the child's process group (Windows: TerminateProcess)
    long pid() const;

    struct Impl;

private:
    explicit Process(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

}  // namespace oam
