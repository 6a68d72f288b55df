// ops.cpp — each torch collective as the dtrain op(s) that do it.
//
// process_group.cpp holds the translation's rules (buffers, dtypes,
// ordering, the padded all-to-all) and the helpers; here is one short
// function per op, in ProcessGroup's order.
#include "ops_common.hpp"

namespace dtrain_torch
{

using c10d::OpType;

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::allreduce(Tensors &ts,
                                                          const c10d::AllreduceOptions &o)
{
    const at::Tensor &t = one_tensor(ts, "allreduce");
    at::Tensor buf = dense(t);
    dt_op op = make_op(DT_OP_ALLREDUCE, o.timeout);
    op.recv = buf.data_ptr();
    op.count = buf.numel();
    op.dtype = reduce_dtype(t.scalar_type(), "allreduce");
    op.redop = reduce_op(o.reduceOp, op.dtype, "allreduce");
    Launch l{OpType::ALLREDUCE, "allreduce", {op}, {buf}, ts, copy_back(t, buf), nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr
ProcessGroupDtrain::allreduce_coalesced(Tensors &ts, const c10d::AllreduceCoalescedOptions &o)
{
    const char *name = "allreduce_coalesced";
    if (ts.empty())
        refuse(name, "no tensors");
    at::Tensor flat = flat_cat(ts, name);
    dt_op op = make_op(DT_OP_ALLREDUCE, o.timeout);
    op.recv = flat.data_ptr();
    op.count = flat.numel();
    op.dtype = reduce_dtype(flat.scalar_type(), name);
    op.redop = reduce_op(o.reduceOp, op.dtype, name);
    Launch l{OpType::ALLREDUCE_COALESCED,
             name,
             {op},
             {flat},
             ts,
             [flat, ts]() mutable { unpack(flat, ts, 0); },
             nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::broadcast(Tensors &ts,
                                                          const c10d::BroadcastOptions &o)
{
    const at::Tensor &t = one_tensor(ts, "broadcast");
    if (o.rootTensor != 0)
        refuse("broadcast", "rootTensor must be 0 (one tensor per rank)");
    at::Tensor buf = dense(t);
    dt_op op = make_op(DT_OP_BROADCAST, o.timeout);
    op.recv = buf.data_ptr();
    op.count = nbytes(buf);
    op.root = static_cast<int>(o.rootRank);
    Launch l{OpType::BROADCAST, "broadcast", {op}, {buf}, ts, copy_back(t, buf), nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::reduce(Tensors &ts, const c10d::ReduceOptions &o)
{
    const at::Tensor &t = one_tensor(ts, "reduce");
    if (o.rootTensor != 0)
        refuse("reduce", "rootTensor must be 0 (one tensor per rank)");
    at::Tensor buf = dense(t);
    dt_op op = make_op(DT_OP_REDUCE, o.timeout);
    op.recv = buf.data_ptr();
    op.count = buf.numel();
    op.dtype = reduce_dtype(t.scalar_type(), "reduce");
    op.redop = reduce_op(o.reduceOp, op.dtype, "reduce");
    op.root = static_cast<int>(o.rootRank);
    Launch l{OpType::REDUCE, "reduce", {op}, {buf}, ts, copy_back(t, buf), nullptr};
    return launch(l);
}

// Checks that `outs` holds `n` tensors shaped like `like`.
static void check_list(const Tensors &outs, size_t n, const at::Tensor &like, const char *op)
{
    if (outs.size() != n)
        refuse(op, "the list has " + std::to_string(outs.size()) + " tensors, the group " +
                       std::to_string(n) + " ranks");
    for (const auto &t : outs) {
        check_tensor(t, op);
        if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type())
            refuse(op, "every tensor of the list must match the input's size and dtype");
    }
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::allgather(std::vector<Tensors> &outs, Tensors &in,
                                                          const c10d::AllgatherOptions &o)
{
    const at::Tensor &t = one_tensor(in, "allgather");
    if (outs.size() != 1)
        refuse("allgather", "takes one output list per rank");
    check_list(outs[0], getSize(), t, "allgather");
    at::Tensor send = dense(t), flat = at::empty({getSize() * t.numel()}, t.options());
    dt_op op = make_op(DT_OP_ALLGATHER, o.timeout);
    op.send = send.data_ptr();
    op.recv = flat.data_ptr();
    op.count = nbytes(send);
    Tensors list = outs[0];
    Launch l{OpType::ALLGATHER,
             "allgather",
             {op},
             {send, flat},
             list,
             [flat, list]() mutable { unpack(flat, list, 0); },
             nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::_allgather_base(at::Tensor &out, at::Tensor &in,
                                                                const c10d::AllgatherOptions &o)
{
    const char *name = "_allgather_base";
    check_tensor(out, name);
    check_tensor(in, name);
    if (out.numel() != getSize() * in.numel() || out.scalar_type() != in.scalar_type())
        refuse(name, "the output must hold world size times the input, of its dtype");
    at::Tensor send = dense(in), recv = dense(out);
    dt_op op = make_op(DT_OP_ALLGATHER, o.timeout);
    op.send = send.data_ptr();
    op.recv = recv.data_ptr();
    op.count = nbytes(send);
    Launch l{OpType::_ALLGATHER_BASE, name,   {op}, {send, recv}, {out},
             copy_back(out, recv),    nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::allgather_coalesced(std::vector<Tensors> &outs,
                                                                    Tensors &in,
                                                                    const c10d::AllgatherOptions &o)
{
    const char *name = "allgather_coalesced";
    if (in.empty() || outs.size() != static_cast<size_t>(getSize()))
        refuse(name, "needs input tensors and one output list per rank");
    at::Tensor send = flat_cat(in, name);
    for (auto &list : outs) {
        if (list.size() != in.size())
            refuse(name, "every output list must be as long as the input list");
        for (size_t i = 0; i < in.size(); i++)
            check_list({list[i]}, 1, in[i], name);
    }
    at::Tensor flat = at::empty({getSize() * send.numel()}, send.options());
    dt_op op = make_op(DT_OP_ALLGATHER, o.timeout);
    op.send = send.data_ptr();
    op.recv = flat.data_ptr();
    op.count = nbytes(send);
    Launch l{OpType::ALLGATHER_COALESCED,
             name,
             {op},
             {send, flat},
             {},
             [flat, outs]() mutable {
                 int64_t off = 0;
                 for (auto &list : outs) {
                     unpack(flat, list, off);
                     for (auto &t : list)
                         off += t.numel();
                 }
             },
             nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::gather(std::vector<Tensors> &outs, Tensors &in,
                                                       const c10d::GatherOptions &o)
{
    const at::Tensor &t = one_tensor(in, "gather");
    bool root = o.rootRank == getRank();
    if (root && outs.size() != 1)
        refuse("gather", "the root takes one output list");
    if (!root && !outs.empty())
        refuse("gather", "only the root takes an output list");
    if (root)
        check_list(outs[0], getSize(), t, "gather");
    at::Tensor send = dense(t);
    at::Tensor flat = root ? at::empty({getSize() * t.numel()}, t.options()) : at::Tensor();
    dt_op op = make_op(DT_OP_GATHER, o.timeout);
    op.send = send.data_ptr();
    op.recv = root ? flat.data_ptr() : nullptr;
    op.count = nbytes(send);
    op.root = static_cast<int>(o.rootRank);
    Tensors list = root ? outs[0] : Tensors();
    std::function<void()> after;
    if (root)
        after = [flat, list]() mutable { unpack(flat, list, 0); };
    Launch l{OpType::GATHER, "gather", {op}, {send, flat}, list, after, nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::scatter(Tensors &out, std::vector<Tensors> &ins,
                                                        const c10d::ScatterOptions &o)
{
    const at::Tensor &t = one_tensor(out, "scatter");
    bool root = o.rootRank == getRank();
    if (root && ins.size() != 1)
        refuse("scatter", "the root takes one input list");
    if (!root && !ins.empty())
        refuse("scatter", "only the root takes an input list");
    if (root)
        check_list(ins[0], getSize(), t, "scatter");
    at::Tensor flat = root ? flat_cat(ins[0], "scatter") : at::Tensor(), recv = dense(t);
    dt_op op = make_op(DT_OP_SCATTER, o.timeout);
    op.send = root ? flat.data_ptr() : nullptr;
    op.recv = recv.data_ptr();
    op.count = nbytes(recv);
    op.root = static_cast<int>(o.rootRank);
    Launch l{OpType::SCATTER, "scatter", {op}, {flat, recv}, out, copy_back(t, recv), nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr ProcessGroupDtrain::reduce_scatter(Tensors &out,
                                                               std::vector<Tensors> &ins,
                                                               const c10d::ReduceScatterOptions &o)
{
    const at::Tensor &t = one_tensor(out, "reduce_scatter");
    if (ins.size() != 1)
        refuse("reduce_scatter", "takes one input list per rank");
    check_list(ins[0], getSize(), t, "reduce_scatter");
    at::Tensor flat = flat_cat(ins[0], "reduce_scatter"), recv = dense(t);
    dt_op op = make_op(DT_OP_REDUCE_SCATTER, o.timeout);
    op.send = flat.data_ptr();
    op.recv = recv.data_ptr();
    op.count = recv.numel();
    op.dtype = reduce_dtype(t.scalar_type(), "reduce_scatter");
    op.redop = reduce_op(o.reduceOp, op.dtype, "reduce_scatter");
    Launch l{OpType::REDUCE_SCATTER, "reduce_scatter", {op}, {flat, recv}, out,
             copy_back(t, recv),     nullptr};
    return launch(l);
}

ProcessGroupDtrain::WorkPtr
ProcessGroupDtrain::_reduce_scatter_base(at::Tensor &out, at::Tensor &in,
                                         const c10d::ReduceScatterOptions &o)
{
    const char *name = "_reduce_scatter_base";
    check_tensor(out, name);
    check_tensor(in, name);
    if (in.numel() != getSize() * out.numel() || out.scalar_type() != in.scalar_type())
        refuse(name, "the input must hold world size times the output, of its dtype");
    at::Tensor send = dense(in), recv = dense(out);
    dt_op op = make_op(DT_OP_REDUCE_SCATTER, o.timeout);
    op.send = send.data_ptr();
    op.recv = recv.data_ptr();
    op.count = recv.numel();
    op.dtype = reduce_dtype(out.scalar_type(), name);
    op.redop = reduce_op(o.reduceOp, op.dtype, name);
    Launch l{OpType::_REDUCE_SCATTER_BASE, name,   {op}, {send, recv}, {out},
             copy_back(out, recv),         nullptr};
    return launch(l);
}

} // namespace dtrain_torch
