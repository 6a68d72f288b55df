/*
 * sigpipe.c — a write to a connection the peer has closed must be an
 * error, not the end of the process.
 *
 * Writing to a socket whose peer reset it raises SIGPIPE, whose default
 * action kills the process — a torch rank that dies would take every dtrain
 * rank with it. Each place here that may write (wire.c's uv_write, and the
 * loop runs in wait.c, whose callbacks write) blocks SIGPIPE on its own
 * thread for the duration, then takes back a SIGPIPE its writes left
 * pending, so the write reports EPIPE and the program's own signal
 * handling is untouched. (The communicator's threads do the same for
 * dtrain's wire.)
 *
 * Cost: two or three system calls around each write or loop run.
 */
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include "gloo.h"

void comm_gloo_sigpipe_block(sigset_t *old)
{
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, old);
}

void comm_gloo_sigpipe_restore(const sigset_t *old)
{
    if (sigismember(old, SIGPIPE))
        return; /* blocked before us: not ours to take */
    sigset_t pending, pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
        struct timespec now = {0, 0};
        sigtimedwait(&pipe, NULL, &now);
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}
