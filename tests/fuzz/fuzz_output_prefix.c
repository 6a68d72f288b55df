/*
 * fuzz_output_prefix.c — dtrain-launch relaying its workers' output
 * (launcher/output_prefix.c): whatever bytes a worker writes, in whatever
 * pieces its pipe delivers them, become whole lines prefixed with the
 * rank, a per-rank log, and the ring of last lines the failure report
 * quotes.
 *
 * Input: byte 0 sets the size of the pieces (1..256 bytes); the rest is
 * the worker's output on one stream. Output goes to /dev/null. Every line
 * in the ring must stay a bounded, terminated string.
 */
#include "fuzz_util.h"
#include "launch.h"

static int devnull = -1;
static FILE *devnull_file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    devnull_file = fopen("/dev/null", "w");
    if (devnull < 0 || !devnull_file)
        abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t piece = (size_t)data[0] + 1;
    output_tail tail;
    memset(&tail, 0, sizeof tail);
    output_stream s;
    launch_output_init(&s, 3, devnull, devnull, &tail);
    for (size_t at = 1; at < size; at += piece)
        launch_output_feed(&s, (const char *)data + at, size - at < piece ? size - at : piece);
    launch_output_finish(&s);
    launch_output_free(&s);
    if (tail.count < 0 || tail.count > OUTPUT_TAIL_LINES)
        abort();
    for (int i = 0; i < OUTPUT_TAIL_LINES; i++)
        if (!memchr(tail.lines[i], '\0', OUTPUT_TAIL_WIDTH))
            abort();
    launch_output_tail_print(&tail, 3, devnull_file);
    return 0;
}
