#!/usr/bin/python3
"""torch_work.py — the "dtrain" backend's Work objects: their limits and their life.

Usage: torch_work.py MODULE_DIR
MODULE_DIR holds the built dtrain_torch module (build/torch_backend).
Each case starts 2 ranks (processes of this script, file:// rendezvous) on
backend "dtrain"; rank 0 plays the case, rank 1 plays along or stays away.

Timeouts, as torch passes them:
  - a collective that rank 1 never joins (all_reduce, barrier) fails on
    rank 0 with a RuntimeError naming the op within the group's timeout
    (init_process_group(timeout=3 s)), not after some default;
  - work.wait(timeout=2 s) on such an op raises a RuntimeError naming the
    op within those 2 s, though the group's timeout is 120 s: the op the
    group still holds back (the last one) and one already submitted.
A Work that outlives its group: both ranks start async all_reduces, call
dist.destroy_process_group(), then look at (is_completed) and wait on the
works: they complete with the right sums. Freed memory is filled with a
pattern (MALLOC_PERTURB_) so that a work reading its group's freed state
crashes or hangs instead of passing by luck; a crash fails the case.
Prints TAP-style "ok"/"not ok" lines, one per case; exits 1 if any failed.
"""
import datetime, os, subprocess, sys, tempfile, time

SLACK_S = 4.0     # start-up of the error path, a loaded 2-core machine
CASE_LIMIT_S = 90  # each case's processes, start-up (importing torch) included


# ---- the ranks ---------------------------------------------------------------

def rank_main(case, url, rank):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    import dtrain_torch  # noqa: F401
    group_s = 3 if case == "group_timeout" or case == "barrier_timeout" else 120
    dist.init_process_group("dtrain", init_method=url, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=group_s))
    CASES[case](torch, dist, rank)


def stay_away(path):
    """Rank 1 of a timeout case: alive (heartbeats go on), in no op, until rank 0 is done."""
    deadline = time.time() + CASE_LIMIT_S
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)


def expect_failure(what, op, limit_s, done_path):
    """Runs what() on rank 0: it must raise RuntimeError naming op within limit_s."""
    t0 = time.perf_counter()
    try:
        what()
        print(f"rank 0: {op} returned; expected a RuntimeError")
    except RuntimeError as e:
        took = time.perf_counter() - t0
        if op not in str(e):
            print(f"rank 0: the error does not name {op}: {e}")
        elif took > limit_s + SLACK_S:
            print(f"rank 0: {op} failed after {took:.1f} s, the limit is {limit_s} s: {e}")
        else:
            print(f"PASS {op} failed after {took:.1f} s: {e}")
    sys.stdout.flush()
    open(done_path, "w").close()
    os._exit(0)  # the group is broken; skip torch's teardown


def done_path():
    return os.environ["TORCH_WORK_DONE"]


def group_timeout(torch, dist, rank):
    if rank == 1:
        return stay_away(done_path())
    expect_failure(lambda: dist.all_reduce(torch.ones(4)), "allreduce", 3, done_path())


def barrier_timeout(torch, dist, rank):
    if rank == 1:
        return stay_away(done_path())
    expect_failure(lambda: dist.barrier(), "barrier", 3, done_path())


def wait_timeout(torch, dist, rank):
    if rank == 1:
        return stay_away(done_path())
    work = dist.all_reduce(torch.ones(4), async_op=True)
    expect_failure(lambda: work.wait(timeout=datetime.timedelta(seconds=2)), "allreduce", 2,
                   done_path())


def wait_timeout_submitted(torch, dist, rank):
    if rank == 1:
        return stay_away(done_path())
    first = dist.all_reduce(torch.ones(4), async_op=True)
    # the first is submitted now, not deferred; the second is kept (a work
    # dropped unwaited is settled, waited, by its destructor)
    second = dist.all_reduce(torch.ones(4), async_op=True)  # noqa: F841
    expect_failure(lambda: first.wait(timeout=datetime.timedelta(seconds=2)), "allreduce", 2,
                   done_path())


def outlives_group(torch, dist, rank):
    import gc
    a = torch.full((1000,), float(rank + 1))
    b = torch.full((10,), float(rank + 10))
    wa = dist.all_reduce(a, async_op=True)  # submitted once the next op comes
    wb = dist.all_reduce(b, async_op=True)  # deferred: the op the group still holds
    dist.destroy_process_group()
    gc.collect()
    first = wb.is_completed()
    wa.wait()
    wb.wait()
    ok = bool((a == 3).all()) and bool((b == 21).all()) and wb.is_completed()
    print(("PASS" if ok else "FAIL") + f" rank {rank}: is_completed() first said {first}, "
          f"then the sums {a[0].item()} {b[0].item()} (expected 3.0 21.0)")


CASES = {"group_timeout": group_timeout, "barrier_timeout": barrier_timeout,
         "wait_timeout": wait_timeout, "wait_timeout_submitted": wait_timeout_submitted,
         "outlives_group": outlives_group}

TITLES = {
    "group_timeout": "an all_reduce one rank never joins fails on the other within the "
                     "group's 3 s timeout, naming allreduce",
    "barrier_timeout": "a barrier one rank never joins fails on the other within the "
                       "group's 3 s timeout, naming barrier",
    "wait_timeout": "work.wait(timeout=2 s) on an all_reduce one rank never joins raises "
                    "within 2 s naming allreduce (the group's timeout is 120 s)",
    "wait_timeout_submitted": "likewise for an all_reduce already handed to the "
                              "communicator's thread (another op followed it)",
    "outlives_group": "works waited after dist.destroy_process_group() complete with the "
                      "right sums, no crash",
}


# ---- the parent --------------------------------------------------------------

def run_case(module_dir, case):
    d = tempfile.mkdtemp(prefix="torch_work_")
    env = dict(os.environ, PYTHONPATH=module_dir, OMP_NUM_THREADS="1", MALLOC_PERTURB_="165",
               TORCH_WORK_DONE=os.path.join(d, "done"))
    url = "file://" + os.path.join(d, "store")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", case, url,
                               str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for r in range(2)]
    logs, deadline = [], time.time() + CASE_LIMIT_S
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + b"\n(killed: over the case's limit)"
        logs.append(out.decode(errors="replace"))
    bad = [f"rank {r} exited {p.returncode}" for r, p in enumerate(procs) if p.returncode]
    playing = [0, 1] if case == "outlives_group" else [0]
    for r in playing:
        if not any(line.startswith("PASS") for line in logs[r].splitlines()):
            bad.append(f"rank {r} did not pass")
    return not bad, bad, logs


def main():
    module_dir = os.path.abspath(sys.argv[1])
    failed = 0
    for case, title in TITLES.items():
        ok, bad, logs = run_case(module_dir, case)
        print(("ok" if ok else "not ok") + " - " + title)
        for r, log in enumerate(logs):
            for line in log.strip().splitlines()[-6:]:
                print(f"#   rank {r}: {line}")
        if not ok:
            print("#   " + "; ".join(bad))
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(main())
