/*
 * torch_allreduce.c — a C rank in a PyTorch job: it joins the group that
 * torch.distributed.init_process_group("gloo", ...) makes (torch 1.13) and
 * all-reduces with the Python ranks. torch_allreduce.py starts both kinds
 * of rank; alone, run one rank as
 *
 *   RANK=1 WORLD_SIZE=2 DT_INIT_URL=file:///tmp/job DT_WIRE=gloo ./torch-allreduce
 *
 * beside a Python rank 0 that calls init_process_group with the same file
 * and then dist.all_reduce on 4 floats. Every rank contributes
 * [r+1, r+1, r+1, r+1] and prints the sum it got, which every rank, C or
 * Python, gets bit for bit alike. Cost: one gloo ring all-reduce.
 */
#include <stdint.h>
#include <stdio.h>

#include <dt_comm.h>

int main(void)
{
    dt_comm_options o;
    uint8_t scratch[64];
    char err[256];
    dt_comm_options_default(&o);
    if (dt_comm_options_from_env(&o, scratch, sizeof scratch, err, sizeof err) != DT_OK) {
        fprintf(stderr, "torch-allreduce: %s\n", err);
        return 2;
    }
    dt_comm *c;
    if (dt_comm_init(&c, &o) != DT_OK) {
        fprintf(stderr, "torch-allreduce: %s\n", dt_comm_error(c));
        dt_comm_destroy(c);
        return 1;
    }
    float x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (float)(o.rank + 1);
    int rc = dt_allreduce(c, x, 4, DT_F32, DT_SUM) != DT_OK;
    if (rc)
        fprintf(stderr, "torch-allreduce: %s\n", dt_comm_error(c));
    else
        printf("C rank %d: %g %g %g %g\n", o.rank, x[0], x[1], x[2], x[3]);
    dt_comm_destroy(c);
    return rc;
}
