/*
 * dtype.c — names, sizes and parsing of the collectives' vocabulary:
 * element types, reductions, operation kinds; and the exported f16/bf16
 * <-> f32 conversions. (The status codes' names live with their type, in
 * base/dt_status.c.)
 *
 * Every name lives in one table indexed by its enum (designated
 * initialisers, sized by the enum's count), so printing and parsing cannot
 * disagree: dt_dtype_parse(dt_dtype_name(t)) == t by construction. A new
 * enum value without an entry prints as "?" and parses as nothing; the
 * tests name every value, so they catch it. Out-of-range values also get
 * "?" (or size 0) rather than reading past a table: they arrive from the
 * wire and from users, so they must be safe to print.
 *
 * The conversions themselves live in half.h (static inline, shared with
 * reduce.c's kernels); here they get their exported names.
 *
 * Cost: table lookups; parsing is a linear scan of at most 12 strings.
 * No state.
 */
#include <string.h>

#include "dt_comm.h"
#include "half.h"
#include "reduce.h"


static const char *const dtype_names[DT_NUM_DTYPES] = {
    [DT_F32] = "f32", [DT_F64] = "f64", [DT_F16] = "f16", [DT_BF16] = "bf16",
    [DT_I8] = "i8",   [DT_U8] = "u8",   [DT_I32] = "i32", [DT_I64] = "i64",
};

static const size_t dtype_sizes[DT_NUM_DTYPES] = {
    [DT_F32] = 4, [DT_F64] = 8, [DT_F16] = 2, [DT_BF16] = 2,
    [DT_I8] = 1,  [DT_U8] = 1,  [DT_I32] = 4, [DT_I64] = 8,
};

static const char *const redop_names[DT_NUM_REDOPS] = {
    [DT_SUM] = "sum", [DT_PROD] = "prod", [DT_MIN] = "min", [DT_MAX] = "max",
    [DT_AVG] = "avg", [DT_BAND] = "band", [DT_BOR] = "bor", [DT_BXOR] = "bxor",
};

static const char *const op_names[DT_NUM_OP_KINDS] = {
    [DT_OP_ALLREDUCE] = "allreduce", [DT_OP_REDUCE_SCATTER] = "reduce_scatter",
    [DT_OP_ALLGATHER] = "allgather", [DT_OP_ALLGATHERV] = "allgatherv",
    [DT_OP_BROADCAST] = "broadcast", [DT_OP_BARRIER] = "barrier",
    [DT_OP_REDUCE] = "reduce",       [DT_OP_GATHER] = "gather",
    [DT_OP_SCATTER] = "scatter",     [DT_OP_ALLTOALL] = "alltoall",
    [DT_OP_SEND] = "send",           [DT_OP_RECV] = "recv",
};

/* Enums may be unsigned or signed; compare through unsigned so that a
 * negative value from a cast is out of range too. */
static const char *name_or_unknown(const char *const *names, size_t n, unsigned value)
{
    return value < n && names[value] ? names[value] : "?";
}

size_t dt_dtype_size(dt_dtype t)
{
    return (unsigned)t < DT_NUM_DTYPES ? dtype_sizes[t] : 0;
}

const char *dt_dtype_name(dt_dtype t)
{
    return name_or_unknown(dtype_names, DT_NUM_DTYPES, (unsigned)t);
}

const char *dt_redop_name(dt_redop op)
{
    return name_or_unknown(redop_names, DT_NUM_REDOPS, (unsigned)op);
}

const char *dt_op_name(dt_op_kind k)
{
    return name_or_unknown(op_names, DT_NUM_OP_KINDS, (unsigned)k);
}

static bool dtype_is_integer(dt_dtype t)
{
    return t == DT_I8 || t == DT_U8 || t == DT_I32 || t == DT_I64;
}

/* Bitwise reductions have no meaning on floats; everything else works on
 * every dtype (sum/prod of integers wrap, see reduce.h). */
bool dt_redop_supports(dt_redop op, dt_dtype t)
{
    if ((unsigned)op >= DT_NUM_REDOPS || (unsigned)t >= DT_NUM_DTYPES)
        return false;
    if (op == DT_BAND || op == DT_BOR || op == DT_BXOR)
        return dtype_is_integer(t);
    return true;
}

/* Exact, case-sensitive match: names travel in config files and on the
 * command line, where "F32" is more likely a typo than a wish. */
static bool parse_name(const char *const *names, size_t n, const char *name, unsigned *out)
{
    if (!name)
        return false;
    for (unsigned i = 0; i < n; i++) {
        if (names[i] && strcmp(names[i], name) == 0) {
            *out = i;
            return true;
        }
    }
    return false;
}

bool dt_dtype_parse(const char *name, dt_dtype *out)
{
    unsigned i;
    if (!parse_name(dtype_names, DT_NUM_DTYPES, name, &i))
        return false;
    *out = (dt_dtype)i;
    return true;
}

bool dt_redop_parse(const char *name, dt_redop *out)
{
    unsigned i;
    if (!parse_name(redop_names, DT_NUM_REDOPS, name, &i))
        return false;
    *out = (dt_redop)i;
    return true;
}

float dt_f16_to_f32(uint16_t h)
{
    return half_f16_to_f32(h);
}
uint16_t dt_f32_to_f16(float f)
{
    return half_f32_to_f16(f);
}
float dt_bf16_to_f32(uint16_t h)
{
    return half_bf16_to_f32(h);
}
uint16_t dt_f32_to_bf16(float f)
{
    return half_f32_to_bf16(f);
}
