#!/usr/bin/python3
"""torch_allreduce.py — Python ranks and C ranks all-reduce together.

Usage: torch_allreduce.py PATH/TO/torch-allreduce [RANKS]
Starts RANKS ranks (default 4) on one file:// rendezvous: the even ranks are
PyTorch 1.13 (this script, torch.distributed with the gloo backend), the odd
ones the C program torch_allreduce.c (dtrain, DT_WIRE=gloo). Each rank
contributes [r+1]*4 and prints what all_reduce gave it: the same sum on
every rank. Needs Debian's python3-torch (1.13); run with /usr/bin/python3.
"""
import datetime, os, subprocess, sys, tempfile


def python_rank(url, rank, size):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=30))
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x)
    line = f"Python rank {rank}: {' '.join(f'{v:g}' for v in x.tolist())}\n"
    sys.stdout.write(line)  # one write: the ranks share the terminal
    sys.stdout.flush()
    dist.destroy_process_group()


def main():
    program, size = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
    path = os.path.join(tempfile.mkdtemp(prefix="torch_allreduce-"), "store")
    url = f"file://{path}"
    env = dict(os.environ, WORLD_SIZE=str(size), DT_INIT_URL=url, DT_WIRE="gloo",
               GLOO_SOCKET_IFNAME="lo")  # torch listens on 127.0.0.1, as dtrain does
    ranks = [subprocess.Popen([program] if r % 2 else
                              [sys.executable, __file__, "--rank", url, str(r), str(size)],
                              env=dict(env, RANK=str(r))) for r in range(size)]
    sys.exit(max(p.wait() for p in ranks))


if __name__ == "__main__":
    if sys.argv[1] == "--rank":
        python_rank(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
