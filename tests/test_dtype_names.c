/*
 * test_dtype_names.c — specification of the collectives' vocabulary: every
 * dtype, reduction, op kind and status has its name (and a dtype its
 * size), names parse back to what they name, unknown names and
 * out-of-range values are refused or printed safely, and each reduction
 * says which dtypes it supports.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "dt_comm.h"
#include "reduce.h"

/* ---- names, sizes, parsing ------------------------------------------------ */

Test(names, every_dtype_has_its_name_and_size, .timeout = 10)
{
    static const struct {
        dt_dtype t;
        const char *name;
        size_t size;
    } want[] = {
        {DT_F32, "f32", 4}, {DT_F64, "f64", 8}, {DT_F16, "f16", 2}, {DT_BF16, "bf16", 2},
        {DT_I8, "i8", 1},   {DT_U8, "u8", 1},   {DT_I32, "i32", 4}, {DT_I64, "i64", 8},
    };
    cr_assert_eq(sizeof want / sizeof want[0], DT_NUM_DTYPES);
    for (size_t i = 0; i < DT_NUM_DTYPES; i++) {
        cr_assert_str_eq(dt_dtype_name(want[i].t), want[i].name);
        cr_assert_eq(dt_dtype_size(want[i].t), want[i].size, "%s", want[i].name);
    }
}

Test(names, out_of_range_values_are_safe_to_print, .timeout = 10)
{
    cr_assert_eq(dt_dtype_size(DT_NUM_DTYPES), 0);
    cr_assert_eq(dt_dtype_size((dt_dtype)-1), 0);
    cr_assert_str_eq(dt_dtype_name(DT_NUM_DTYPES), "?");
    cr_assert_str_eq(dt_redop_name((dt_redop)99), "?");
    cr_assert_str_eq(dt_op_name(DT_NUM_OP_KINDS), "?");
    cr_assert_str_eq(dt_status_name((dt_status)(DT_ENOMEM + 1)), "?");
}

Test(names, every_redop_has_its_name, .timeout = 10)
{
    static const char *const want[DT_NUM_REDOPS] = {"sum", "prod", "min", "max",
                                                    "avg", "band", "bor", "bxor"};
    for (int op = 0; op < DT_NUM_REDOPS; op++)
        cr_assert_str_eq(dt_redop_name((dt_redop)op), want[op]);
}

Test(names, every_status_has_its_name, .timeout = 10)
{
    static const char *const want[] = {"DT_OK",     "DT_EINVAL", "DT_ETIMEDOUT",
                                       "DT_EPEER",  "DT_EPROTO", "DT_EABORTED",
                                       "DT_ESTORE", "DT_ESYS",   "DT_ENOMEM"};
    for (int s = 0; s <= DT_ENOMEM; s++)
        cr_assert_str_eq(dt_status_name((dt_status)s), want[s]);
}

Test(names, every_op_kind_has_its_name, .timeout = 10)
{
    static const char *const want[DT_NUM_OP_KINDS] = {"allreduce",  "reduce_scatter", "allgather",
                                                      "allgatherv", "broadcast",      "barrier",
                                                      "reduce",     "gather",         "scatter",
                                                      "alltoall",   "send",           "recv"};
    for (int k = 0; k < DT_NUM_OP_KINDS; k++)
        cr_assert_str_eq(dt_op_name((dt_op_kind)k), want[k]);
}

Test(parse, every_dtype_name_parses_back_to_its_dtype, .timeout = 10)
{
    for (int t = 0; t < DT_NUM_DTYPES; t++) {
        dt_dtype got = (dt_dtype)-1;
        cr_assert(dt_dtype_parse(dt_dtype_name((dt_dtype)t), &got));
        cr_assert_eq((int)got, t);
    }
}

Test(parse, every_redop_name_parses_back_to_its_redop, .timeout = 10)
{
    for (int op = 0; op < DT_NUM_REDOPS; op++) {
        dt_redop got = (dt_redop)-1;
        cr_assert(dt_redop_parse(dt_redop_name((dt_redop)op), &got));
        cr_assert_eq((int)got, op);
    }
}

Test(parse, unknown_names_are_rejected_and_leave_out_alone, .timeout = 10)
{
    static const char *const bad[] = {"",  "F32", "f3",   "f322",    "float",
                                      "?", "SUM", "sum ", "average", "bf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_dtype t = DT_I64;
        dt_redop op = DT_BXOR;
        cr_assert_not(dt_dtype_parse(bad[i], &t), "accepted \"%s\"", bad[i]);
        cr_assert_not(dt_redop_parse(bad[i], &op), "accepted \"%s\"", bad[i]);
        cr_assert_eq(t, DT_I64);
        cr_assert_eq(op, DT_BXOR);
    }
    dt_dtype t;
    dt_redop op;
    cr_assert_not(dt_dtype_parse(NULL, &t));
    cr_assert_not(dt_redop_parse(NULL, &op));
}

Test(supports, bitwise_ops_only_on_integers_the_rest_everywhere, .timeout = 10)
{
    for (int t = 0; t < DT_NUM_DTYPES; t++) {
        bool integer = t == DT_I8 || t == DT_U8 || t == DT_I32 || t == DT_I64;
        for (int op = 0; op < DT_NUM_REDOPS; op++) {
            bool bitwise = op == DT_BAND || op == DT_BOR || op == DT_BXOR;
            cr_assert_eq(dt_redop_supports((dt_redop)op, (dt_dtype)t), !bitwise || integer,
                         "%s on %s", dt_redop_name((dt_redop)op), dt_dtype_name((dt_dtype)t));
        }
    }
    cr_assert_not(dt_redop_supports(DT_NUM_REDOPS, DT_I32));
    cr_assert_not(dt_redop_supports(DT_SUM, DT_NUM_DTYPES));
}
