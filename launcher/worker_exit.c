/*
 * worker_exit.c — how a worker ended, in words: "exited with code 3", "was
 * killed by signal 9 (SIGKILL)", "was stopped by dtrain-launch (SIGTERM)"
 * (the launcher's own signal, sent while tearing the group down: a reader
 * must not go looking for an outside killer), "could not be started: ...".
 *
 * Both the group (worker_group.c, as each worker is reaped and when the
 * launcher is signalled) and the verdict on a failed group (root_cause.c)
 * say it, so it sits below both. Cost: one snprintf.
 */
#include <signal.h>
#include <stdio.h>

#include "launch.h"

const char *launch_signal_name(int sig)
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig)
            return names[i].name;
    return "a signal";
}

void launch_worker_describe_exit(const worker *w, char *buf, size_t len)
{
    if (w->spawn_error)
        snprintf(buf, len, "could not be started: %s", uv_strerror(w->spawn_error));
    else if (w->term_signal && (w->signalled & 1u << w->term_signal))
        snprintf(buf, len, "was stopped by dtrain-launch (%s)", launch_signal_name(w->term_signal));
    else if (w->term_signal)
        snprintf(buf, len, "was killed by signal %d (%s)", w->term_signal,
                 launch_signal_name(w->term_signal));
    else
        snprintf(buf, len, "exited with code %lld", (long long)w->exit_status);
}
