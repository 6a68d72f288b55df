#!/usr/bin/python3
"""torch_tcpstore.py — PyTorch's TCPStore client against dtrain's TCP store.

Usage: torch_tcpstore.py DTRAIN_LAUNCH
Starts `dtrain-launch --rdzv-endpoint 127.0.0.1:PORT sleep 30`, whose node 0
hosts dtrain's store server, and drives it with torch.distributed.TCPStore
(is_master=False), the client of Debian's python3-torch (1.13); then two
dtrain ranks (launch_worker, no launcher) rendezvous at a TCPStore(is_master
=True) that torch hosts and all-reduce. Each check names what it checks;
any mismatch exits 1.
"""
import datetime, socket, subprocess, sys, time
import torch.distributed as dist

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def check(what, got, want):
    if got != want:
        sys.exit(f"FAIL {what}: got {got!r}, want {want!r}")
    print(f"ok {what}")

port = free_port()
server = subprocess.Popen([sys.argv[1], "--rdzv-endpoint", f"127.0.0.1:{port}", "sleep", "30"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    deadline = time.time() + 10
    while True:  # the launcher listens before it starts its worker
        try:
            s = dist.TCPStore("127.0.0.1", port, is_master=False,
                              timeout=datetime.timedelta(seconds=5))
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    s.set("a", "hello")
    check("set then get", s.get("a"), b"hello")
    check("add to an absent key", s.add("n", 5), 5)
    check("add again", s.add("n", 2), 7)
    check("get of an added key is decimal text", s.get("n"), b"7")
    s.wait(["a", "n"])
    check("num_keys", s.num_keys(), 2)
    check("compare_set that matches", s.compare_set("a", "hello", "bye"), b"bye")
    check("compare_set that does not", s.compare_set("a", "x", "y"), b"bye")
    check("compare_set creating a key", s.compare_set("new", "", "v"), b"v")
    check("delete_key of a key", s.delete_key("a"), True)
    check("delete_key of a deleted key", s.delete_key("a"), False)
    try:
        s.wait(["missing"], datetime.timedelta(seconds=0.3))
        sys.exit("FAIL wait for a missing key returned")
    except Exception as e:
        print(f"ok wait for a missing key times out ({e})")
finally:
    server.terminate()
    server.wait()

# The other direction: dtrain's ranks (two launch_workers, no launcher) meet
# at a TCPStore(is_master=True) that torch hosts, and reduce.
port = free_port()
master = dist.TCPStore("127.0.0.1", port, is_master=True,
                       timeout=datetime.timedelta(seconds=10))
worker = sys.argv[1].replace("launcher/dtrain-launch", "tests/launch_worker")
env = {"WORLD_SIZE": "2", "DT_INIT_URL": f"tcp://127.0.0.1:{port}", "DT_JOB_ID": "torchjob",
       "DT_SECRET": "00" * 32, "PATH": "/usr/bin:/bin"}
ranks = [subprocess.Popen([worker, "allreduce"], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
         for r in range(2)]
outs = [p.communicate(timeout=30)[0] for p in ranks]
for r, (p, out) in enumerate(zip(ranks, outs)):
    check(f"dtrain rank {r} through torch's server exits 0", (p.returncode, out.strip()),
          (0, f"rank={r} world=2 sum=3"))
check("dtrain's keys live in torch's server", master.num_keys() >= 2, True)
