#!/bin/sh
# make_seeds.sh — writes the seed corpora in corpus/NAME/ (committed; rerun
# after a format changes). Small genuine examples of each input: the
# harnesses that own a format's set-up write theirs (DT_FUZZ_SEED_OUT),
# minigpt writes real checkpoint manifests, the rest are written here.
#
#   tests/fuzz/make_seeds.sh BUILD-FUZZ-DIR BUILD-DIR
#   (BUILD-DIR: a plain build, for minigpt)
set -eu
fuzz=$(cd "$1" && pwd)/tests/fuzz
minigpt=$(cd "$2" && pwd)/train/minigpt
cd "$(dirname "$0")"
c=corpus
rm -rf "$c"
mkdir -p "$c"
for h in store_log token_shard manifest ckpt_shard frames handshake cli_minigpt cli_launch \
         cli_bench output_prefix; do
    mkdir -p "$c/fuzz_$h"
done

# Harness-made seeds: each runs its set-up, writes the seed, fuzzes 0 runs.
seed() { DT_FUZZ_SEED_OUT="$c/$1/$2" "$fuzz/$1" -runs=0 >/dev/null 2>&1; }
seed fuzz_ckpt_shard rank00000.bin
seed fuzz_frames genuine_rank0
seed fuzz_handshake valid_hello

# Store logs: dtrain's records (job "job"), PyTorch's, and an add counter.
python3 - "$c/fuzz_store_log" <<'PY'
import os, struct, sys
def rec(k, v):
    return struct.pack("<I", len(k)) + k + struct.pack("<I", len(v)) + v
d = sys.argv[1]
open(os.path.join(d, "dtrain_job"), "wb").write(
    rec(b"job/addr/0", b"40000 127.0.0.1") + rec(b"job/addr/1", b"40001 127.0.0.1") +
    rec(b"job/secret", bytes(range(32))) + rec(b"job/count", b"2") + rec(b"job/count", b"3"))
open(os.path.join(d, "pytorch_and_others"), "wb").write(
    rec(b"/rank0", b"ready") + rec(b"cleanup/", b"1") + rec(b"-", b"/rank0") +
    rec(b"other/addr/0", b"1 h") + rec(b"job/", b""))
PY

# llm.c token shards: five tokens, and an empty one.
python3 - "$c/fuzz_token_shard" <<'PY'
import os, struct, sys
d = sys.argv[1]
def shard(tokens):
    return struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) + \
        struct.pack("<%dH" % len(tokens), *tokens)
open(os.path.join(d, "five_tokens"), "wb").write(shard([1, 2, 3, 50256, 7]))
open(os.path.join(d, "empty"), "wb").write(shard([]))
PY

# Manifests: a 4-rank ZeRO-1 checkpoint (the seed preset) and a 1-rank DDP one.
tmp=$(mktemp -d)
(cd "$tmp" && env -u RANK -u WORLD_SIZE "$minigpt" -n 10 --log-every 5 --eval-every 0 --sample 0 \
    --ckpt-dir ddp --ckpt-every 10 >/dev/null 2>&1)
cp "$tmp"/ddp/step_00000010/manifest.json "$c/fuzz_manifest/ddp_world1.json"
python3 - "$tmp/zero1.json" <<'PY'
import json, sys
shard = lambda r, lo, n: {"rank": r, "file": "rank%05d.bin" % r, "bytes": 200 + 16 * n,
    "sha256": "0" * 64, "ranges": {k: [lo, n] for k in ("params", "master", "m", "v")}}
json.dump({"format": "dtrain-checkpoint", "schema_version": 1, "step": 10, "world_size": 2,
    "mode": "zero1", "num_params": 29824,
    "config": {"V": 64, "T": 16, "L": 2, "H": 4, "C": 32}, "seed": 1337, "data_row": 640,
    "rng_state": 1337, "shards": [shard(0, 0, 14912), shard(1, 14912, 14912)]},
    open(sys.argv[1], "w"), indent=1)
PY
cp "$tmp/zero1.json" "$c/fuzz_manifest/zero1_world2.json"
rm -rf "$tmp"

# Command lines, one argument per line.
printf -- '--preset\nseed\n--steps\n5' >"$c/fuzz_cli_minigpt/preset"
printf -- '-V\n64\n-C\n32\n-H\n4\n-L\n2\n-T\n16\n--parallel\nzero1\n--lr\n3e-3\n--ckpt-dir\nck\n--ckpt-every\n10\n--keep\n2\n--resume\nauto' \
    >"$c/fuzz_cli_minigpt/flags"
printf -- '--bucket-mb=0.5\n--data\nrandom\n--grad-accum\n2\n--seed\n18446744073709551615\n--check-replicas' \
    >"$c/fuzz_cli_minigpt/values"
printf -- '-n\n4\n--max-restarts\n2\n./minigpt\n--preset\nseed' >"$c/fuzz_cli_launch/local"
printf -- '--nnodes\n2\n--node-rank\n1\n--rdzv\nfile:///tmp/r\n--run-id\nx\nprog' \
    >"$c/fuzz_cli_launch/nodes"
printf -- '--grace\n0.5\n--log-dir\nlogs\n--\nprog\n-n' >"$c/fuzz_cli_launch/grace"
printf -- '-c\nall\n-b\n4\n-e\n64M\n-f\n8\n-d\nbf16\n-o\navg\n--check\n--ranks\n4' \
    >"$c/fuzz_cli_bench/all"
printf -- '--algo\nring\n-r\n3\n-n\n2\n-w\n1\n--minbytes=1K\n--maxbytes=1G' \
    >"$c/fuzz_cli_bench/long"
# Worker output: byte 0 sets the read size, then lines, one long, one unfinished.
{ printf '\007'; printf '[0] step 1 loss 4.3\nwarning: \033[31mred\033[0m\r\n'
  head -c 300 /dev/zero | tr '\0' x; printf '\nno newline at the end'; } \
    >"$c/fuzz_output_prefix/lines"
ls -R "$c" | head -50
