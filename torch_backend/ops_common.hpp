// ops_common.hpp — internal to the backend: the helpers that turn torch's
// tensors and options into dt_op fields, and the description of one launch.
// process_group.cpp states the rules they follow.
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "process_group.hpp"

namespace dtrain_torch
{


using Tensors = std::vector<at::Tensor>;

[[noreturn]] inline void refuse(const char *op, const std::string &why)
{
    throw std::runtime_error(std::string("dtrain ") + op + ": " + why);
}

inline void check_tensor(const at::Tensor &t, const char *op)
{
    if (!t.defined())
        refuse(op, "a tensor is undefined");
    if (!t.device().is_cpu())
        refuse(op, "tensors must be on the CPU, this one is on " + t.device().str());
    if (t.layout() != at::kStrided)
        refuse(op, "tensors must be dense (strided), not sparse");
}

inline const at::Tensor &one_tensor(const Tensors &ts, const char *op)
{
    if (ts.size() != 1)
        refuse(op, "takes one tensor per rank, got " + std::to_string(ts.size()));
    check_tensor(ts[0], op);
    return ts[0];
}

inline at::Tensor dense(const at::Tensor &t)
{
    return t.is_contiguous() ? t : t.contiguous();
}

inline size_t nbytes(const at::Tensor &t)
{
    return static_cast<size_t>(t.numel()) * t.element_size();
}

inline dt_dtype reduce_dtype(at::ScalarType s, const char *op)
{
    switch (s) {
    case at::kFloat: return DT_F32;
    case at::kDouble: return DT_F64;
    case at::kHalf: return DT_F16;
    case at::kBFloat16: return DT_BF16;
    case at::kChar: return DT_I8;
    case at::kByte: return DT_U8;
    case at::kInt: return DT_I32;
    case at::kLong: return DT_I64;
    default: refuse(op, std::string("cannot reduce dtype ") + c10::toString(s));
    }
}

inline dt_redop reduce_op(const c10d::ReduceOp &r, dt_dtype t, const char *op)
{
    dt_redop d;
    switch (r.op_) {
    case c10d::ReduceOp::SUM: d = DT_SUM; break;
    case c10d::ReduceOp::AVG: d = DT_AVG; break;
    case c10d::ReduceOp::PRODUCT: d = DT_PROD; break;
    case c10d::ReduceOp::MIN: d = DT_MIN; break;
    case c10d::ReduceOp::MAX: d = DT_MAX; break;
    case c10d::ReduceOp::BAND: d = DT_BAND; break;
    case c10d::ReduceOp::BOR: d = DT_BOR; break;
    case c10d::ReduceOp::BXOR: d = DT_BXOR; break;
    default: refuse(op, "reduction op " + std::to_string(int(r.op_)) + " is not supported");
    }
    if (!dt_redop_supports(d, t))
        refuse(op, std::string(dt_redop_name(d)) + " is not defined for " + dt_dtype_name(t));
    return d;
}

inline double seconds(std::chrono::milliseconds t)
{
    return t.count() > 0 ? t.count() / 1000.0 : 0; /* unset: the communicator's */
}

inline dt_op make_op(dt_op_kind kind, std::chrono::milliseconds timeout)
{
    dt_op op{};
    op.kind = kind;
    op.dtype = DT_U8;
    op.timeout_s = seconds(timeout);
    return op;
}

// The tensors, flattened and joined into one contiguous buffer.
inline at::Tensor flat_cat(const Tensors &ts, const char *op)
{
    Tensors flat;
    for (const auto &t : ts) {
        check_tensor(t, op);
        if (t.scalar_type() != ts[0].scalar_type())
            refuse(op, "tensors of one list must share a dtype");
        flat.push_back(t.reshape({-1}));
    }
    return at::cat(flat);
}

// Copies consecutive pieces of flat, from element `off` on, into outs.
inline void unpack(const at::Tensor &flat, Tensors &outs, int64_t off)
{
    for (auto &t : outs) {
        t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
    }
}

// After the op: the result into the caller's tensor, if it was a copy.
inline std::function<void()> copy_back(at::Tensor to, at::Tensor from)
{
    if (to.is_same(from))
        return nullptr;
    return [to, from]() mutable { to.copy_(from); };
}

inline double env_seconds(const char *name, double fallback)
{
    const char *v = getenv(name);
    char *end = nullptr;
    double s = v && *v ? strtod(v, &end) : 0;
    if (!v || !*v)
        return fallback;
    if (*end || !(s > 0))
        refuse("init", std::string(name) + "='" + v + "' is not a positive number of seconds");
    return s;
}


struct ProcessGroupDtrain::Launch {
    c10d::OpType type;
    const char *name;
    std::vector<dt_op> ops;
    Tensors keep, outputs;
    std::function<void()> after;
    std::shared_ptr<int> source;
};


} // namespace dtrain_torch
