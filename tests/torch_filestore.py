#!/usr/bin/python3
"""torch_filestore.py — dtrain's file:// store and PyTorch's FileStore on one file.

Usage: torch_filestore.py STORE_CLI
STORE_CLI is tests/store_cli (dtrain's store from the command line). Checks,
against torch.distributed.FileStore of Debian's python3-torch (1.13):
keys cross both ways in PyTorch's key space (dtrain's empty job id), dtrain
opening and closing a file torch uses leaves it, torch closing a file dtrain
uses leaves it, and a job id torch would read as a delete is refused. Each
check names what it checks; any mismatch exits 1.
"""
import gc, os, subprocess, sys, tempfile
import torch.distributed as dist

cli = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="dtrain-filestore-")

def check(what, got, want):
    if got != want:
        sys.exit(f"FAIL {what}: got {got!r}, want {want!r}")
    print(f"ok {what}")

def dtrain(path, job, *args):
    p = subprocess.run([cli, f"file://{path}", job, *args], capture_output=True, text=True,
                       timeout=30)
    return p.returncode, p.stdout.strip(), p.stderr.strip()

# torch first: it holds the file while dtrain comes and goes (in torch's
# key space: dtrain's empty job id)
path = os.path.join(tmp, "shared")
torch_store = dist.FileStore(path, 2)
torch_store.set("from_torch", "t1")
check("dtrain reads a key torch set (empty job id = torch's key space)",
      dtrain(path, "", "get", "from_torch")[:2], (0, "t1"))
check("dtrain sets a key", dtrain(path, "", "set", "from_dtrain", "d1")[0], 0)
check("torch reads the key dtrain set", torch_store.get("from_dtrain"), b"d1")
check("dtrain's last close leaves a file torch uses", os.path.exists(path), True)
torch_store.set("after", "still")
check("torch's store still works after dtrain left", torch_store.get("after"), b"still")
del torch_store
gc.collect()
if os.path.exists(path):
    os.unlink(path)

# dtrain first: torch comes and goes while dtrain holds the file
path = os.path.join(tmp, "dtrain_first")
holder = subprocess.Popen([cli, f"file://{path}", "job", "hold", "3"], stdout=subprocess.PIPE,
                          text=True)
check("dtrain holds the file", holder.stdout.readline().strip(), "open")
brief = dist.FileStore(path, 1)
brief.set("k", "v")
del brief
gc.collect()
check("torch's last close leaves a file dtrain uses", os.path.exists(path), True)
check("dtrain's holder exits 0", holder.wait(timeout=30), 0)
check("dtrain's last close leaves a file torch used (torch's to remove)",
      os.path.exists(path), True)
os.unlink(path)

rc, _, err = dtrain(os.path.join(tmp, "minus"), "-job", "get", "k", "0.1")
check("a job id starting with '-' is refused", (rc, "deletion record" in err), (1, True))
os.rmdir(tmp)
