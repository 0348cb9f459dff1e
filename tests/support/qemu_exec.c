/* Keeps a process and the programs it execs under qemu-user.
 *
 * qemu-user emulates one process image: when the guest calls exec, the kernel runs the new
 * image natively. PyInstaller's bootloader (the dist) restarts itself with exec once it has
 * set its environment, so the bridge itself would run on the host CPU. Preloaded into the
 * guest (qemu-x86_64 -E LD_PRELOAD=this.so), the exec family is rewritten to exec
 * $OAM_QEMU -cpu $OAM_QEMU_CPU <program> <args...>: the restarted image runs on the same
 * emulated CPU, with this library preloaded again. Test use only (tests/shipping/test_cpu_variants.py).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

typedef int (*execve_fn)(const char *, char *const[], char *const[]);

static int emulated(const char *path, char *const argv[], char *const envp[]) {
    execve_fn real = (execve_fn)dlsym(RTLD_NEXT, "execve");
    const char *qemu = getenv("OAM_QEMU");
    const char *cpu = getenv("OAM_QEMU_CPU");
    const char *self = getenv("OAM_QEMU_PRELOAD");
    if (!qemu || !cpu || !self || strcmp(path, qemu) == 0)
        return real(path, argv, envp);
    int argc = 0;
    while (argv[argc]) argc++;
    size_t len = strlen("LD_PRELOAD=") + strlen(self) + 1;
    char *preload = malloc(len);
    char **args = malloc(sizeof(char *) * (size_t)(argc + 8));
    if (!preload || !args) { errno = ENOMEM; return -1; }
    strcpy(preload, "LD_PRELOAD=");
    strcat(preload, self);
    int n = 0;
    args[n++] = (char *)qemu;
    args[n++] = "-cpu";
    args[n++] = (char *)cpu;
    args[n++] = "-E";
    args[n++] = preload;
    args[n++] = "-0";
    args[n++] = argc > 0 ? argv[0] : (char *)path;
    args[n++] = (char *)path;
    for (int i = 1; i < argc; i++) args[n++] = argv[i];
    args[n] = NULL;
    /* qemu itself runs natively: the host's loader must not preload this guest library */
    int envc = 0;
    while (envp[envc]) envc++;
    char **env = malloc(sizeof(char *) * (size_t)(envc + 1));
    if (!env) { errno = ENOMEM; return -1; }
    int m = 0;
    for (int i = 0; i < envc; i++)
        if (strncmp(envp[i], "LD_PRELOAD=", 11) != 0) env[m++] = envp[i];
    env[m] = NULL;
    return real(qemu, args, env);
}

int execve(const char *path, char *const argv[], char *const envp[]) { return emulated(path, argv, envp); }
int execv(const char *path, char *const argv[]) { return emulated(path, argv, environ); }

int execvp(const char *file, char *const argv[]) {
    if (strchr(file, '/')) return emulated(file, argv, environ);
    const char *path = getenv("PATH");
    char buf[4096];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n + strlen(file) + 2 < sizeof buf) {
            memcpy(buf, p, n);
            buf[n] = '/';
            strcpy(buf + n + 1, file);
            if (access(buf, X_OK) == 0) return emulated(buf, argv, environ);
        }
        if (!end) break;
        p = end + 1;
    }
    errno = ENOENT;
    return -1;
}
