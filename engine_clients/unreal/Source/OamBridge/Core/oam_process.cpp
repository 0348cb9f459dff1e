// oam_process.cpp - POSIX (fork/exec) and Windows (CreateProcessW) implementations.
#include "oam_process.h"

#include <mutex>
#include <system_error>
#include <thread>

#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#if defined(PLATFORM_WINDOWS) && PLATFORM_WINDOWS  // inside an Unreal build (its PCH is force-included)
#include "Windows/AllowWindowsPlatformTypes.h"
#include <windows.h>
#include "Windows/HideWindowsPlatformTypes.h"
#else
#include <windows.h>
#endif
#else
#include <cerrno>
#include <csignal>
#include <fcntl.h>
#include <pthread.h>
#include <cstdlib>
#include <cstring>
#if defined(__linux__)
#include <sys/prctl.h>
#endif
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
extern char** environ;
#endif

namespace oam {

std::vector<std::string> splitCommandLine(std::string_view command) {
    std::vector<std::string> out;
    std::string cur;
    bool inWord = false;
    char quote = 0;
    for (std::size_t i = 0; i < command.size(); ++i) {
        const char c = command[i];
        if (quote != 0) {
            if (c == quote) quote = 0;
            else if (c == '\\' && quote == '"' && i + 1 < command.size()) cur += command[++i];
            else cur += c;
        } else if (c == '\'' || c == '"') {
            quote = c;
            inWord = true;
        } else if (c == '\\' && i + 1 < command.size()) {
            cur += command[++i];
            inWord = true;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            if (inWord) out.push_back(std::move(cur));
            cur.clear();
            inWord = false;
        } else {
            cur += c;
            inWord = true;
        }
    }
    if (inWord) out.push_back(std::move(cur));
    return out;
}

#ifndef _WIN32
// ---------------------------------------------------------------- POSIX

namespace {

void closeFd(int& fd) {
    if (fd >= 0) {
        ::close(fd);
        fd = -1;
    }
}

void makePipe(int fds[2]) {
#if defined(__linux__)
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
#else
    if (::pipe(fds) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    ::fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    ::fcntl(fds[1], F_SETFD, FD_CLOEXEC);
#endif
    // A parent started with fd 0, 1 or 2 closed would hand those numbers out here, and the
    // dup2 onto the child's 0/1/2 would then go wrong: move such fds above 2.
    for (int i = 0; i < 2; ++i) {
        if (fds[i] > 2) continue;
        const int moved = ::fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
        if (moved < 0) throw std::system_error(errno, std::generic_category(), "fcntl");
        ::close(fds[i]);
        fds[i] = moved;
    }
}

long readFd(int fd, char* buffer, std::size_t size) {
    if (fd < 0) return -1;
    for (;;) {
        const ssize_t n = ::read(fd, buffer, size);
        if (n >= 0) return static_cast<long>(n);
        if (errno != EINTR) return -1;
    }
}

}  // namespace

struct Process::Impl {
    pid_t pid = -1;
    int in = -1, out = -1, err = -1;
    std::mutex waitMu;
    std::optional<int> status;

    ~Impl() {
        closeFd(in);
        closeFd(out);
        closeFd(err);
    }

    // Reaps without blocking; returns the status once known. Caller holds waitMu.
    std::optional<int> poll() {
        if (status || pid <= 0) return status;
        int st = 0;
        const pid_t r = ::waitpid(pid, &st, WNOHANG);
        if (r == pid) {
            if (WIFEXITED(st)) status = WEXITSTATUS(st);
            else if (WIFSIGNALED(st)) status = 128 + WTERMSIG(st);
            else status = -1;
        } else if (r < 0 && errno != EINTR) {
            status = -1;  // not our child any more (ECHILD): someone else reaped it
        }
        return status;
    }

    void signalGroup(int sig) {
        std::lock_guard<std::mutex> lock(waitMu);
        if (!poll() && pid > 0) ::kill(-pid, sig);  // its own process group (see spawn)
    }
};

Process::Process(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {

// Where execve should look for argv[0], like execvp: argv[0] itself when it holds a '/', else each
// PATH entry (an empty one is the working directory). Built before fork: the child must not allocate.
std::vector<std::string> executableCandidates(const std::string& file) {
    if (file.find('/') != std::string::npos) return {file};
    const char* path = std::getenv("PATH");
    const std::string dirs = path ? path : "/bin:/usr/bin";
    std::vector<std::string> out;
    std::size_t begin = 0;
    for (;;) {
        const std::size_t colon = dirs.find(':', begin);
        const std::string dir = dirs.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin);
        out.push_back(dir.empty() ? file : dir + "/" + file);
        if (colon == std::string::npos) break;
        begin = colon + 1;
    }
    return out;
}

[[noreturn]] void failChild(int statusFd, int err) {
    while (::write(statusFd, &err, sizeof err) < 0 && errno == EINTR) {
    }
    ::_exit(127);
}

// The child between fork and exec: async-signal-safe calls only (the game has other threads,
// and the child has a copy of their locks). Reports a failure as an errno on statusFd.
[[noreturn]] void execChild(const std::vector<const char*>& candidates, char* const* argv, const char* cwd,
                            int stdinFd, int stdoutFd, int stderrFd, int statusFd, bool dieWithParent, pid_t parent) {
    auto fail = [statusFd](int err) { failChild(statusFd, err); };
    // Its own process group, so kill() reaches anything it started and a terminal's Ctrl-C does
    // not (the bridge exits on stdin EOF when the game goes away).
    if (::setpgid(0, 0) != 0) fail(errno);
#if defined(__linux__)
    // The game crashing (even SIGKILL) must not orphan the bridge: the kernel sends SIGKILL when
    // the thread that spawned it exits. The parent may already be gone: then exit now.
    if (dieWithParent) {
        if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(errno);
        if (::getppid() != parent) ::_exit(127);
    }
#else
    (void)dieWithParent;
    (void)parent;
#endif
    if (::dup2(stdinFd, 0) < 0 || ::dup2(stdoutFd, 1) < 0 || ::dup2(stderrFd, 2) < 0) fail(errno);
    // dup2 cleared close-on-exec on 0/1/2; every other descriptor of ours stays close-on-exec.
    // Default signal handling and an empty mask, whatever the game's threads had.
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &dfl, nullptr);  // EINVAL for reserved ones: fine
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // chdir in the child: posix_spawn_file_actions_addchdir_np would need glibc 2.29, newer than
    // Unreal's Linux sysroot (tests/old_glibc.h keeps it out).
    if (cwd != nullptr && ::chdir(cwd) != 0) fail(errno);
    int err = ENOENT;
    for (const char* candidate : candidates) {
        ::execve(candidate, argv, environ);
        if (errno != ENOENT && errno != ENOTDIR) err = errno;  // e.g. EACCES: remember it, keep looking
    }
    failChild(statusFd, err);
}

}  // namespace

std::unique_ptr<Process> Process::spawn(const SpawnOptions& options) {
    if (options.argv.empty()) throw std::system_error(EINVAL, std::generic_category(), "empty command");
    auto impl = std::make_unique<Impl>();
    int inP[2] = {-1, -1}, outP[2] = {-1, -1}, errP[2] = {-1, -1}, statusP[2] = {-1, -1};
    auto closeAll = [&] {
        for (int* p : {inP, outP, errP, statusP}) {
            closeFd(p[0]);
            closeFd(p[1]);
        }
    };
    try {
        makePipe(inP);
        makePipe(outP);
        makePipe(errP);
        makePipe(statusP);  // close-on-exec: EOF on a successful exec, an errno if it failed
    } catch (...) {
        closeAll();
        throw;
    }

    // Everything the child needs, allocated before fork.
    const std::vector<std::string> candidates = executableCandidates(options.argv[0]);
    std::vector<const char*> candidatePtrs;
    for (const auto& c : candidates) candidatePtrs.push_back(c.c_str());
    std::vector<char*> argv;
    argv.reserve(options.argv.size() + 1);
    for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const char* cwd = options.workingDirectory.empty() ? nullptr : options.workingDirectory.c_str();
    const pid_t parent = ::getpid();

    // No signal handler of the game may run in the child before exec.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t pid = ::fork();
    if (pid == 0)
        execChild(candidatePtrs, argv.data(), cwd, inP[0], outP[1], errP[1], statusP[1], options.dieWithParent, parent);
    const int forkErr = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) {
        closeAll();
        throw std::system_error(forkErr, std::generic_category(), "fork");
    }
    closeFd(statusP[1]);
    int childErr = 0;
    ssize_t n;
    while ((n = ::read(statusP[0], &childErr, sizeof childErr)) < 0 && errno == EINTR) {
    }
    if (n == static_cast<ssize_t>(sizeof childErr)) {  // setpgid, chdir or exec failed: reap the child
        int st = 0;
        while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        closeAll();
        throw std::system_error(childErr, std::generic_category(), "spawn " + options.argv[0]);
    }
    impl->pid = pid;
    impl->in = inP[1];
    impl->out = outP[0];
    impl->err = errP[0];
    inP[1] = outP[0] = errP[0] = -1;
    closeAll();  // the child's ends
#ifdef F_SETNOSIGPIPE
    ::fcntl(impl->in, F_SETNOSIGPIPE, 1);  // macOS: EPIPE instead of SIGPIPE on this fd
#endif
    return std::unique_ptr<Process>(new Process(std::move(impl)));
}

Process::~Process() {
    if (!impl_) return;
    closeFd(impl_->in);
    if (!waitFor(std::chrono::milliseconds(0))) {
        kill();
        waitFor(std::chrono::milliseconds(5000));
    }
}

bool Process::write(std::string_view data) {
    const int fd = impl_->in;
    if (fd < 0) return false;
#ifdef F_SETNOSIGPIPE
    const bool maskSigpipe = false;
#else
    const bool maskSigpipe = true;
#endif
    // Block SIGPIPE on this thread while writing; if the write raised one, consume it
    // (unless one was already pending before), so EPIPE is just an error code.
    sigset_t pipeSet, oldMask, pending;
    sigemptyset(&pipeSet);
    sigaddset(&pipeSet, SIGPIPE);
    bool wasPending = false;
    if (maskSigpipe) {
        pthread_sigmask(SIG_BLOCK, &pipeSet, &oldMask);
        sigemptyset(&pending);
        wasPending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    }
    bool ok = true, gotEpipe = false;
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n > 0) {
            data.remove_prefix(static_cast<std::size_t>(n));
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            gotEpipe = n < 0 && errno == EPIPE;
            ok = false;
            break;
        }
    }
    if (maskSigpipe) {
        if (gotEpipe && !wasPending) {
#if defined(__linux__)
            const timespec zero{0, 0};
            while (sigtimedwait(&pipeSet, nullptr, &zero) < 0 && errno == EINTR) {
            }
#else
            int sig = 0;
            sigemptyset(&pending);
            if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) sigwait(&pipeSet, &sig);
#endif
        }
        pthread_sigmask(SIG_SETMASK, &oldMask, nullptr);
    }
    return ok;
}

void Process::closeStdin() { closeFd(impl_->in); }

long Process::readStdout(char* buffer, std::size_t size) { return readFd(impl_->out, buffer, size); }
long Process::readStderr(char* buffer, std::size_t size) { return readFd(impl_->err, buffer, size); }

std::optional<int> Process::waitFor(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        {
            std::lock_guard<std::mutex> lock(impl_->waitMu);
            if (auto st = impl_->poll()) return st;
        }
        if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

void Process::terminate() { impl_->signalGroup(SIGTERM); }
void Process::kill() { impl_->signalGroup(SIGKILL); }
long Process::pid() const { return static_cast<long>(impl_->pid); }

#else
// ---------------------------------------------------------------- Windows (not compiled here)

namespace {

std::wstring widen(const std::string& s) {
    if (s.empty()) return {};
    const int n = MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), nullptr, 0);
    std::wstring w(static_cast<std::size_t>(n), L'\0');
    MultiByteToWideChar(CP_UTF8, 0, s.data(), static_cast<int>(s.size()), &w[0], n);
    return w;
}

// Quotes one argument the way CommandLineToArgvW / the MSVC runtime parse it.
std::wstring quoteArg(const std::wstring& a) {
    if (!a.empty() && a.find_first_of(L" \t\"") == std::wstring::npos) return a;
    std::wstring q = L"\"";
    std::size_t slashes = 0;
    for (wchar_t c : a) {
        if (c == L'\\') { ++slashes; continue; }
        if (c == L'"') q.append(slashes * 2 + 1, L'\\');
        else q.append(slashes, L'\\');
        slashes = 0;
        q += c;
    }
    q.append(slashes * 2, L'\\');
    q += L'"';
    return q;
}

void closeH(HANDLE& h) {
    if (h != nullptr && h != INVALID_HANDLE_VALUE) CloseHandle(h);
    h = nullptr;
}

long readH(HANDLE h, char* buffer, std::size_t size) {
    DWORD n = 0;
    if (ReadFile(h, buffer, static_cast<DWORD>(size), &n, nullptr)) return static_cast<long>(n);
    return GetLastError() == ERROR_BROKEN_PIPE ? 0 : -1;
}

}  // namespace

struct Process::Impl {
    HANDLE process = nullptr;
    HANDLE job = nullptr;  // kill-on-close: the bridge (and what it started) dies with the game
    DWORD pid = 0;
    HANDLE in = nullptr, out = nullptr, err = nullptr;
    ~Impl() {
        closeH(in);
        closeH(out);
        closeH(err);
        closeH(process);
        closeH(job);  // JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: ends a bridge still in it
    }
};

Process::Process(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Process> Process::spawn(const SpawnOptions& options) {
    if (options.argv.empty()) throw std::system_error(ERROR_INVALID_PARAMETER, std::system_category(), "empty command");
    SECURITY_ATTRIBUTES sa{static_cast<DWORD>(sizeof(SECURITY_ATTRIBUTES)), nullptr, TRUE};
    HANDLE inR = nullptr, inW = nullptr, outR = nullptr, outW = nullptr, errR = nullptr, errW = nullptr;
    HANDLE job = nullptr;
    LPPROC_THREAD_ATTRIBUTE_LIST attrs = nullptr;
    std::vector<char> attrsBuffer;
    auto fail = [&](const char* what) {
        const DWORD e = GetLastError();
        if (attrs != nullptr) DeleteProcThreadAttributeList(attrs);
        for (HANDLE* h : {&inR, &inW, &outR, &outW, &errR, &errW, &job}) closeH(*h);
        throw std::system_error(static_cast<int>(e), std::system_category(), what);
    };
    if (!CreatePipe(&inR, &inW, &sa, 0) || !CreatePipe(&outR, &outW, &sa, 0) || !CreatePipe(&errR, &errW, &sa, 0))
        fail("CreatePipe");
    // The parent's ends must not be inherited.
    SetHandleInformation(inW, HANDLE_FLAG_INHERIT, 0);
    SetHandleInformation(outR, HANDLE_FLAG_INHERIT, 0);
    SetHandleInformation(errR, HANDLE_FLAG_INHERIT, 0);

    // bInheritHandles=TRUE alone would hand the bridge every inheritable handle of the game
    // (sockets, files, other children's pipes, whose readers then never see EOF). The handle
    // list restricts inheritance to the child's three pipe ends.
    HANDLE inherited[3] = {inR, outW, errW};
    SIZE_T attrsSize = 0;
    InitializeProcThreadAttributeList(nullptr, 1, 0, &attrsSize);
    attrsBuffer.resize(attrsSize);
    attrs = reinterpret_cast<LPPROC_THREAD_ATTRIBUTE_LIST>(attrsBuffer.data());
    if (!InitializeProcThreadAttributeList(attrs, 1, 0, &attrsSize)) {
        attrs = nullptr;
        fail("InitializeProcThreadAttributeList");
    }
    if (!UpdateProcThreadAttribute(attrs, 0, PROC_THREAD_ATTRIBUTE_HANDLE_LIST, inherited, sizeof inherited, nullptr,
                                   nullptr))
        fail("UpdateProcThreadAttribute");

    // A job object that kills its processes when its last handle closes: ours closes when the
    // game exits or crashes, so the bridge never outlives it. Created suspended and resumed once
    // in the job, so nothing it starts escapes. Best effort: a game already in a job that
    // forbids nesting (Windows 7) runs the bridge without one (it still exits on stdin EOF).
    if (options.dieWithParent) {
        job = CreateJobObjectW(nullptr, nullptr);  // not inheritable
        if (job != nullptr) {
            JOBOBJECT_EXTENDED_LIMIT_INFORMATION limits{};
            limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
            if (!SetInformationJobObject(job, JobObjectExtendedLimitInformation, &limits, sizeof limits)) closeH(job);
        }
    }

    std::wstring cmd;
    for (const auto& a : options.argv) {
        if (!cmd.empty()) cmd += L' ';
        cmd += quoteArg(widen(a));
    }
    const std::wstring cwd = widen(options.workingDirectory);
    STARTUPINFOEXW si{};
    si.StartupInfo.cb = sizeof(si);
    si.StartupInfo.dwFlags = STARTF_USESTDHANDLES;
    si.StartupInfo.hStdInput = inR;
    si.StartupInfo.hStdOutput = outW;
    si.StartupInfo.hStdError = errW;
    si.lpAttributeList = attrs;
    PROCESS_INFORMATION pi{};
    const DWORD flags = CREATE_NO_WINDOW | CREATE_NEW_PROCESS_GROUP | EXTENDED_STARTUPINFO_PRESENT |
                        (job != nullptr ? CREATE_SUSPENDED : 0);
    if (!CreateProcessW(nullptr, &cmd[0], nullptr, nullptr, TRUE, flags, nullptr, cwd.empty() ? nullptr : cwd.c_str(),
                        &si.StartupInfo, &pi))
        fail("CreateProcessW");
    DeleteProcThreadAttributeList(attrs);
    attrs = nullptr;
    if (job != nullptr) {
        if (!AssignProcessToJobObject(job, pi.hProcess)) closeH(job);
        ResumeThread(pi.hThread);
    }
    CloseHandle(pi.hThread);
    closeH(inR);
    closeH(outW);
    closeH(errW);
    auto impl = std::make_unique<Impl>();
    impl->process = pi.hProcess;
    impl->job = job;
    impl->pid = pi.dwProcessId;
    impl->in = inW;
    impl->out = outR;
    impl->err = errR;
    return std::unique_ptr<Process>(new Process(std::move(impl)));
}

Process::~Process() {
    if (!impl_) return;
    closeH(impl_->in);
    if (!waitFor(std::chrono::milliseconds(0))) {
        kill();
        waitFor(std::chrono::milliseconds(5000));
    }
}

bool Process::write(std::string_view data) {
    while (!data.empty()) {
        DWORD n = 0;
        const DWORD chunk = static_cast<DWORD>(data.size() > (1u << 20) ? (1u << 20) : data.size());
        if (impl_->in == nullptr || !WriteFile(impl_->in, data.data(), chunk, &n, nullptr)) return false;
        data.remove_prefix(n);
    }
    return true;
}

void Process::closeStdin() { closeH(impl_->in); }
long Process::readStdout(char* buffer, std::size_t size) { return readH(impl_->out, buffer, size); }
long Process::readStderr(char* buffer, std::size_t size) { return readH(impl_->err, buffer, size); }

std::optional<int> Process::waitFor(std::chrono::milliseconds timeout) {
    if (WaitForSingleObject(impl_->process, static_cast<DWORD>(timeout.count())) != WAIT_OBJECT_0) return std::nullopt;
    DWORD code = 0;
    GetExitCodeProcess(impl_->process, &code);
    return static_cast<int>(code);
}

void Process::terminate() { TerminateProcess(impl_->process, 1); }
void Process::kill() {  // the whole job when there is one: what the bridge started goes too
    if (impl_->job == nullptr || !TerminateJobObject(impl_->job, 1)) TerminateProcess(impl_->process, 1);
}
long Process::pid() const { return static_cast<long>(impl_->pid); }

#endif

}  // namespace oam
