/*
 * api.c — the typed, blocking and async forms of every operation.
 *
 * Each wrapper only fills a dt_op (the table in dt_comm.h says which field
 * means what) and calls dt_run (blocking) or dt_submit (async); all the
 * logic lives behind those two.
 */
#include "comm_internal.h"

static dt_op op_of(dt_op_kind kind, const void *send, void *recv, size_t count, dt_dtype t)
{
    dt_op op = {0};
    op.kind = kind;
    op.send = send;
    op.recv = recv;
    op.count = count;
    op.dtype = t;
    op.redop = DT_SUM;
    op.root = -1;
    return op;
}

dt_status dt_allreduce_async(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop r,
                             dt_work **w)
{
    dt_op op = op_of(DT_OP_ALLREDUCE, NULL, buf, count, t);
    op.redop = r;
    return dt_submit(c, &op, w);
}

dt_status dt_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop r)
{
    dt_op op = op_of(DT_OP_ALLREDUCE, NULL, buf, count, t);
    op.redop = r;
    return dt_run(c, &op);
}

dt_status dt_reduce_scatter_async(dt_comm *c, const void *send, void *recv, size_t recvcount,
                                  dt_dtype t, dt_redop r, dt_work **w)
{
    dt_op op = op_of(DT_OP_REDUCE_SCATTER, send, recv, recvcount, t);
    op.redop = r;
    return dt_submit(c, &op, w);
}

dt_status dt_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t recvcount, dt_dtype t,
                            dt_redop r)
{
    dt_op op = op_of(DT_OP_REDUCE_SCATTER, send, recv, recvcount, t);
    op.redop = r;
    return dt_run(c, &op);
}

dt_status dt_allgather_async(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t,
                             dt_work **w)
{
    dt_op op = op_of(DT_OP_ALLGATHER, send, recv, count, t);
    return dt_submit(c, &op, w);
}

dt_status dt_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t)
{
    dt_op op = op_of(DT_OP_ALLGATHER, send, recv, count, t);
    return dt_run(c, &op);
}

dt_status dt_allgatherv(dt_comm *c, const void *send, void *recv, const size_t *counts, dt_dtype t)
{
    dt_op op = op_of(DT_OP_ALLGATHERV, send, recv, 0, t);
    op.counts = counts;
    if (counts)
        op.count = counts[dt_comm_rank(c)];
    return dt_run(c, &op);
}

dt_status dt_broadcast_async(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_work **w)
{
    dt_op op = op_of(DT_OP_BROADCAST, NULL, buf, count, t);
    op.root = root;
    return dt_submit(c, &op, w);
}

dt_status dt_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root)
{
    dt_op op = op_of(DT_OP_BROADCAST, NULL, buf, count, t);
    op.root = root;
    return dt_run(c, &op);
}

dt_status dt_barrier(dt_comm *c)
{
    dt_op op = op_of(DT_OP_BARRIER, NULL, NULL, 0, DT_U8);
    return dt_run(c, &op);
}

dt_status dt_reduce(dt_comm *c, void *buf, size_t count, dt_dtype t, dt_redop r, int root)
{
    dt_op op = op_of(DT_OP_REDUCE, NULL, buf, count, t);
    op.redop = r;
    op.root = root;
    return dt_run(c, &op);
}

dt_status dt_gather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root)
{
    dt_op op = op_of(DT_OP_GATHER, send, recv, count, t);
    op.root = root;
    return dt_run(c, &op);
}

dt_status dt_scatter(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t, int root)
{
    dt_op op = op_of(DT_OP_SCATTER, send, recv, count, t);
    op.root = root;
    return dt_run(c, &op);
}

dt_status dt_alltoall(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype t)
{
    dt_op op = op_of(DT_OP_ALLTOALL, send, recv, count, t);
    return dt_run(c, &op);
}

dt_status dt_send_async(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer,
                        uint32_t tag, dt_work **w)
{
    dt_op op = op_of(DT_OP_SEND, buf, NULL, count, t);
    op.peer = peer;
    op.tag = tag;
    return dt_submit(c, &op, w);
}

dt_status dt_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, uint32_t tag)
{
    dt_work *w;
    dt_status st = dt_send_async(c, buf, count, t, peer, tag, &w);
    return st == DT_OK ? dt_work_wait(w) : st;
}

dt_status dt_recv_async(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, uint32_t tag,
                        int *source, dt_work **w)
{
    dt_op op = op_of(DT_OP_RECV, NULL, buf, count, t);
    op.peer = peer;
    op.tag = tag;
    op.source = source;
    return dt_submit(c, &op, w);
}

dt_status dt_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, uint32_t tag,
                  int *source)
{
    dt_work *w;
    dt_status st = dt_recv_async(c, buf, count, t, peer, tag, source, &w);
    return st == DT_OK ? dt_work_wait(w) : st;
}
