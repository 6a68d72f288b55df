/*
 * bench_device.c — a bench_case's buffers in device memory (see
 * bench_device.h). Copies here are synchronous and outside the timed loop.
 */
#include "bench_device.h"

static dt_status copy(bench_device_case *dc, void *dst, const void *src, size_t n, bool up)
{
    if (n == 0)
        return DT_OK;
    dt_status st = up ? dt_device_copy_h2d(dc->dev, dst, src, n, dc->stream)
                      : dt_device_copy_d2h(dc->dev, dst, src, n, dc->stream);
    if (st == DT_OK)
        st = dt_device_event_record(dc->dev, dc->event, dc->stream);
    if (st == DT_OK)
        st = dt_device_event_synchronize(dc->dev, dc->event);
    return st;
}

dt_status bench_device_case_init(bench_device_case *dc, dt_device *dev, const bench_case *bc)
{
    size_t es = dt_dtype_size(bc->op.dtype);
    *dc = (bench_device_case){.dev = dev, .op = bc->op};
    dc->send_bytes = bc->send ? bc->send_count * es : 0;
    dc->recv_bytes = bc->recv ? bc->recv_count * es : 0;
    dt_status st = dt_device_stream_create(dev, &dc->stream);
    if (st == DT_OK)
        st = dt_device_event_create(dev, &dc->event);
    if (st == DT_OK && dc->send_bytes)
        st = dt_device_alloc(dev, &dc->send, dc->send_bytes);
    if (st == DT_OK && dc->recv_bytes)
        st = dt_device_alloc(dev, &dc->recv, dc->recv_bytes);
    if (st == DT_OK)
        st = bench_device_case_upload(dc, bc);
    if (st != DT_OK) {
        bench_device_case_free(dc);
        return st;
    }
    if (bc->send)
        dc->op.send = dc->send;
    if (bc->recv)
        dc->op.recv = dc->recv;
    return DT_OK;
}

void bench_device_case_free(bench_device_case *dc)
{
    dt_device_free(dc->dev, dc->send);
    dt_device_free(dc->dev, dc->recv);
    dt_device_event_destroy(dc->dev, dc->event);
    dt_device_stream_destroy(dc->dev, dc->stream);
    dc->send = dc->recv = NULL;
    dc->event = NULL;
    dc->stream = NULL;
}

dt_status bench_device_case_upload(bench_device_case *dc, const bench_case *bc)
{
    dt_status st = copy(dc, dc->send, bc->send, dc->send_bytes, true);
    return st == DT_OK ? copy(dc, dc->recv, bc->recv, dc->recv_bytes, true) : st;
}

dt_status bench_device_case_download(bench_device_case *dc, bench_case *bc)
{
    return copy(dc, bc->recv, dc->recv, dc->recv_bytes, false);
}
