/* LD_PRELOAD this to print the native stack of a segfault (no gdb on the H200 image):
 *   gcc -shared -fPIC -O0 -o /tmp/segv_backtrace.so segv_backtrace.c
 *   LD_PRELOAD=/tmp/segv_backtrace.so python3 crashing.py
 * Symbols of shared libraries print as library(function+offset); addr2line resolves the rest. */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_segv(int sig) {
    void *frames[64];
    int n = backtrace(frames, 64);
    const char *head = "\n== native backtrace (segv_backtrace.so) ==\n";
    write(2, head, strlen(head));
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    void *warm[1];
    backtrace(warm, 1); /* load libgcc's unwinder now, not inside the handler */
    signal(SIGSEGV, on_segv);
}
