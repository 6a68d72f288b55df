// process_group.cpp — torch's collectives, each as dtrain ops on one
// communicator.
//
// The backend is a translation, not an implementation: every torch op
// here becomes one dtrain op (two for the all-to-alls with uneven splits),
// submitted on the group's dt_comm and waited through a WorkDtrain
// (work.cpp). The rules of the translation:
//   - Buffers: dtrain reads and writes plain memory, so a non-contiguous
//     tensor is given a contiguous copy and the result copied back after.
//     Ops whose inputs or outputs are lists (allgather, gather, scatter,
//     reduce_scatter, the coalesced ones) pack them into one flat buffer.
//   - Types: ops that only move bytes (broadcast, gathers, scatters,
//     all-to-alls, send/recv) move any dtype as bytes; reductions take the
//     dtypes dtrain reduces (f32 f64 f16 bf16 i8 u8 i32 i64), which are
//     those torch's gloo reduces.
//   - Ordering: dtrain, like gloo, meets the n-th collective of every rank;
//     one mutex keeps submissions from several threads (DDP's autograd
//     hooks) in one order per rank.
//   - All-to-all with uneven splits: dtrain's all-to-all moves equal
//     blocks, so the ranks first agree on the largest block (an i64 max
//     all-reduce) and every block is padded to it: one extra small
//     collective and at most p·max bytes moved instead of Σ splits.
// Whatever torch asks that this cannot do raises RuntimeError naming the
// op (the ProcessGroup base class does the same for ops not overridden).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include <c10/util/accumulate.h>
#include <sodium.h>

#include "ops_common.hpp"
#include "store_adapter.hpp"

namespace dtrain_torch
{

c10::intrusive_ptr<WorkDtrain> ProcessGroupDtrain::launch(Launch &l)
{
    std::vector<dt_work *> handles;
    bool defer = l.ops.size() == 1 && l.ops[0].kind != DT_OP_SEND && l.ops[0].kind != DT_OP_RECV;
    GroupState &g = *state_;
    std::lock_guard<std::mutex> lock(g.submit_mu);
    g.flush_locked(); /* ops go to dtrain in the order torch gave them */
    if (defer) {
        auto w = c10::make_intrusive<WorkDtrain>(state_, getRank(), l.type, l.name, handles,
                                                 std::move(l.keep), std::move(l.after),
                                                 std::move(l.outputs), std::move(l.source));
        w->deferred = l.ops[0];
        g.pending = w.get();
        return w;
    }
    for (dt_op &op : l.ops) {
        dt_work *w = nullptr;
        if (dt_submit(g.comm, &op, &w) != DT_OK) {
            std::string why = dt_comm_error(g.comm);
            for (dt_work *h : handles)
                (void)dt_work_wait(h);
            refuse(l.name, why);
        }
        handles.push_back(w);
    }
    return c10::make_intrusive<WorkDtrain>(state_, getRank(), l.type, l.name, std::move(handles),
                                           std::move(l.keep), std::move(l.after),
                                           std::move(l.outputs), std::move(l.source));
}

ProcessGroupDtrain::ProcessGroupDtrain(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), state_(std::make_shared<GroupState>())
{
    dt_comm_options o;
    dt_comm_options_default(&o);
    o.rank = rank;
    o.world_size = size;
    o.job_id = "torch";
    o.host = getenv("DT_HOST");
    o.ifname = getenv("DT_IFNAME");
    /* with neither, the address this rank advertises is the one its route
     * to MASTER_ADDR leaves by (env://, torchrun, dtrain-launch), else
     * 127.0.0.1: init_url only picks it, the store is torch's */
    if (getenv("MASTER_ADDR") && getenv("MASTER_PORT"))
        o.init_url = "env://";
    o.timeout_s = env_seconds("DT_TIMEOUT", 0);
    o.progress_timeout_s = env_seconds("DT_PROGRESS_TIMEOUT", seconds(timeout));
    o.init_timeout_s = env_seconds("DT_INIT_TIMEOUT", seconds(timeout));
    uint8_t secret[64];
    const char *hex = getenv("DT_SECRET");
    size_t len = 0;
    if (hex && *hex) {
        if (sodium_init() < 0 ||
            sodium_hex2bin(secret, sizeof secret, hex, strlen(hex), nullptr, &len, nullptr) != 0 ||
            len == 0 || len * 2 != strlen(hex))
            refuse("init", "DT_SECRET is not a hex string of at most 64 bytes");
        o.secret = secret;
        o.secret_len = len;
    }
    dt_store *s = nullptr;
    dt_status st = dt_store_open_ops(&s, store_ops(), store.get(), "torch store", "dtrain");
    o.store = s;
    if (st == DT_OK)
        st = dt_comm_init(&state_->comm, &o);
    sodium_memzero(secret, sizeof secret);
    dt_comm *c = state_->comm;
    std::string why = st == DT_OK ? "" : c ? dt_comm_error(c) : dt_store_error(s);
    dt_store_close(s);
    if (st != DT_OK)
        refuse("init", why); /* ~GroupState destroys the communicator */
    state_->completer = std::make_unique<Completer>();
}

// The works torch still holds keep the state, and so the communicator,
// alive (group_state.cpp).
ProcessGroupDtrain::~ProcessGroupDtrain()
{
    state_->close();
}

c10::intrusive_ptr<c10d::ProcessGroup>
ProcessGroupDtrain::create(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                           std::chrono::duration<float> timeout)
{
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
    return c10::make_intrusive<ProcessGroupDtrain>(store, rank, size, ms);
}

// The largest of every rank's `mine` (uneven all-to-alls: the block size).
int64_t ProcessGroupDtrain::agree_max(int64_t mine, const char *op)
{
    std::lock_guard<std::mutex> g(state_->submit_mu);
    state_->flush_locked();
    if (dt_allreduce(state_->comm, &mine, 1, DT_I64, DT_MAX) != DT_OK)
        refuse(op, dt_comm_error(state_->comm));
    return mine;
}

// ---- all-to-all: equal blocks, or padded to the largest ------------------

// Sends block j of `blocks` (offset, bytes) to rank j, block r of what
// arrives into `into`'s pieces: both lists padded to the agreed largest.
struct Blocks {
    std::vector<const uint8_t *> from;
    std::vector<size_t> from_len;
    std::vector<uint8_t *> to;
    std::vector<size_t> to_len;
};

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::padded_alltoall(Launch &l, const Blocks &b,
                                                                std::chrono::milliseconds timeout)
{
    size_t mine = 0;
    for (size_t j = 0; j < b.from.size(); j++)
        mine = std::max({mine, b.from_len[j], b.to_len[j]});
    auto block = static_cast<size_t>(agree_max(static_cast<int64_t>(mine), l.name));
    int64_t p = getSize();
    at::Tensor send = at::zeros({p * static_cast<int64_t>(block)}, at::kByte);
    at::Tensor recv = at::empty({p * static_cast<int64_t>(block)}, at::kByte);
    for (int64_t j = 0; j < p; j++)
        if (b.from_len[j])
            memcpy(send.data_ptr<uint8_t>() + j * block, b.from[j], b.from_len[j]);
    dt_op op = make_op(DT_OP_ALLTOALL, timeout);
    op.send = send.data_ptr();
    op.recv = recv.data_ptr();
    op.count = block;
    l.ops = {op};
    l.keep.insert(l.keep.end(), {send, recv});
    std::function<void()> then = std::move(l.after);
    l.after = [b, recv, block, then]() {
        for (size_t j = 0; j < b.to.size(); j++)
            if (b.to_len[j])
                memcpy(b.to[j], recv.data_ptr<uint8_t>() + j * block, b.to_len[j]);
        if (then)
            then();
    };
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::alltoall_base(at::Tensor &out, at::Tensor &in,
                                                              std::vector<int64_t> &out_splits,
                                                              std::vector<int64_t> &in_splits,
                                                              const c10d::AllToAllOptions &o)
{
    const char *name = "alltoall_base";
    check_tensor(out, name);
    check_tensor(in, name);
    if (out.scalar_type() != in.scalar_type())
        refuse(name, "input and output must share a dtype");
    int64_t p = getSize();
    at::Tensor send = dense(in), recv = dense(out);
    Launch l{c10d::OpType::ALLTOALL_BASE, name,   {}, {send, recv}, {out},
             copy_back(out, recv),        nullptr};
    if (out_splits.empty() && in_splits.empty()) {
        if (in.numel() != out.numel() || in.numel() % p)
            refuse(name, "input and output must be equal and divide by the world size");
        dt_op op = make_op(DT_OP_ALLTOALL, o.timeout);
        op.send = send.data_ptr();
        op.recv = recv.data_ptr();
        op.count = nbytes(send) / p;
        l.ops = {op};
        return launch(l);
    }
    if (in.dim() == 0 || out.dim() == 0)
        refuse(name, "split sizes need tensors of at least one dimension");
    Blocks b;
    auto fill = [&](const at::Tensor &t, std::vector<int64_t> &splits, bool is_in) {
        size_t row = c10::multiply_integers(t.sizes().slice(1)) * t.element_size();
        int64_t rows = t.size(0), off = 0;
        if (splits.empty() && rows % p)
            refuse(name, "without split sizes dim 0 must divide by the world size");
        if (!splits.empty() && static_cast<int64_t>(splits.size()) != p)
            refuse(name, "one split size per rank");
        for (int64_t j = 0; j < p; j++) {
            int64_t n = splits.empty() ? rows / p : splits[j];
            if (n < 0 || off + n > rows)
                refuse(name, "the split sizes do not fit dim 0 of the tensor");
            if (is_in) {
                b.from.push_back(static_cast<const uint8_t *>(send.data_ptr()) + off * row);
                b.from_len.push_back(n * row);
            } else {
                b.to.push_back(static_cast<uint8_t *>(recv.data_ptr()) + off * row);
                b.to_len.push_back(n * row);
            }
            off += n;
        }
    };
    fill(send, in_splits, true);
    fill(recv, out_splits, false);
    return padded_alltoall(l, b, o.timeout);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::alltoall(Tensors &out, Tensors &in,
                                                         const c10d::AllToAllOptions &o)
{
    const char *name = "alltoall";
    size_t p = getSize();
    if (out.size() != p || in.size() != p)
        refuse(name, "takes one input and one output tensor per rank");
    Blocks b;
    Tensors keep, dense_out;
    for (size_t j = 0; j < p; j++) {
        check_tensor(in[j], name);
        check_tensor(out[j], name);
        at::Tensor s = dense(in[j]), r = dense(out[j]);
        keep.insert(keep.end(), {s, r});
        dense_out.push_back(r);
        b.from.push_back(static_cast<const uint8_t *>(s.data_ptr()));
        b.from_len.push_back(nbytes(s));
        b.to.push_back(static_cast<uint8_t *>(r.data_ptr()));
        b.to_len.push_back(nbytes(r));
    }
    Launch l{c10d::OpType::ALLTOALL,
             name,
             {},
             keep,
             out,
             [out, dense_out]() mutable {
                 for (size_t j = 0; j < out.size(); j++)
                     if (!out[j].is_same(dense_out[j]))
                         out[j].copy_(dense_out[j]);
             },
             nullptr};
    return padded_alltoall(l, b, o.timeout);
}

// ---- point to point and barrier -------------------------------------------

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::p2p(Tensors &ts, int peer, int tag, bool is_send,
                                                    c10d::OpType type, const char *name)
{
    const at::Tensor &t = one_tensor(ts, name);
    if (tag < 0)
        refuse(name, "tag " + std::to_string(tag) + " is negative");
    at::Tensor buf = dense(t);
    dt_op op = make_op(is_send ? DT_OP_SEND : DT_OP_RECV, std::chrono::milliseconds(0));
    if (is_send)
        op.send = buf.data_ptr();
    else
        op.recv = buf.data_ptr();
    op.count = nbytes(buf);
    op.peer = peer;
    op.tag = static_cast<uint32_t>(tag);
    std::shared_ptr<int> source;
    if (!is_send) {
        source = std::make_shared<int>(peer);
        op.source = source.get();
    }
    Launch l{type, name, {op}, {buf}, ts, is_send ? nullptr : copy_back(t, buf), source};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::send(Tensors &ts, int dst, int tag)
{
    return p2p(ts, dst, tag, true, c10d::OpType::SEND, "send");
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::recv(Tensors &ts, int src, int tag)
{
    return p2p(ts, src, tag, false, c10d::OpType::RECV, "recv");
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::recvAnysource(Tensors &ts, int tag)
{
    return p2p(ts, DT_ANY_SOURCE, tag, false, c10d::OpType::RECVANYSOURCE, "recvAnysource");
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::barrier(const c10d::BarrierOptions &o)
{
    Launch l{c10d::OpType::BARRIER,
             "barrier",
             {make_op(DT_OP_BARRIER, o.timeout)},
             {},
             {},
             nullptr,
             nullptr};
    return launch(l);
}

} // namespace dtrain_torch
