// old_glibc.h - force-included (g++ -include) when run_tests.sh compiles the core once more as
// Unreal's Linux sysroot would see it. UE5's cross-toolchains (clang v20-v25) build against
// glibc 2.17; functions that glibc added later link on this machine and fail there (unresolved
// symbol, or a packaged game that does not start on an older distribution). Poisoning them
// turns any use into a compile error here. Add to the list when the core grows.
#pragma once
// The headers that declare them first (a poisoned name may not appear even in a declaration).
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>
#if __has_include(<sys/random.h>)
#include <sys/random.h>
#endif
#if __has_include(<sys/pidfd.h>)
#include <sys/pidfd.h>
#endif
#pragma GCC poison posix_spawn_file_actions_addchdir_np   /* glibc 2.29 */
#pragma GCC poison posix_spawn_file_actions_addfchdir_np  /* glibc 2.29 */
#pragma GCC poison posix_spawn_file_actions_addclosefrom_np /* glibc 2.34 */
#pragma GCC poison closefrom close_range                 /* glibc 2.34 */
#pragma GCC poison pidfd_open pidfd_send_signal pidfd_spawn /* glibc 2.36 / 2.39 */
#pragma GCC poison execveat                              /* glibc 2.34 */
#pragma GCC poison reallocarray                          /* glibc 2.26 */
#pragma GCC poison getrandom getentropy                  /* glibc 2.25 */
#pragma GCC poison copy_file_range memfd_create          /* glibc 2.27 */
