#!/bin/sh
# check_symbols.sh — every global symbol a layer defines carries a prefix
# the layer owns: dt_ for its public API, its own internal prefix for the
# rest (checkpoint ckpt_, launcher launch_, collectives comm_).
# Unprefixed globals collide across layers and with the
# programs that link them, and hide which archive a symbol came from.
#
#   check_symbols.sh LAYER FILE PREFIXES [PENDING]
#
# FILE: the layer's static archive, or its program (nm lists what a linked
# executable defines; the toolchain's own symbols (_start, data_start, ...),
# main, copies of shared libraries' data (stdout@GLIBC_2.2.5) and the C++
# runtime's weak references in nvcc objects (DW.ref.*) are ignored). PREFIXES: a
# space-separated list. PENDING: a file of names (one a line, # comments)
# known to lack a prefix and scheduled for renaming; they are tolerated,
# any other is not. Prints TAP: one test.
set -eu
layer=$1 file=$2 prefixes=$3 pending=${4:-/dev/null}

echo "1..1"
syms=$(nm -g --defined-only "$file") || {
    echo "not ok 1 - $layer: nm could not read $file"
    exit 1
}
bad=$(printf '%s\n' "$syms" | awk -v prefixes="$prefixes" -v pending="$pending" '
    BEGIN {
        n = split(prefixes, p, " ")
        while ((getline line < pending) > 0) {
            sub(/#.*/, "", line); gsub(/[ \t]/, "", line)
            if (line != "") known[line] = 1
        }
    }
    NF == 3 && $2 ~ /^[TDBRCVWGSi]$/ {
        if ($3 ~ /^DW\.ref\./) next            # weak refs of the C++ runtime (nvcc)
        name = $3; sub(/\..*$/, "", name)       # dt_gemm.resolver -> dt_gemm
        if (name ~ /^(_|main$|data_start$)/ || name ~ /@/ || name in known || name in seen)
            next                                # toolchain, libc copies
        for (i = 1; i <= n; i++)
            if (index(name, p[i]) == 1) next
        seen[name] = 1
        print name
    }' | sort)
if [ -z "$bad" ]; then
    echo "ok 1 - $layer: every global symbol starts with one of: $prefixes"
else
    echo "not ok 1 - $layer: global symbols without one of the prefixes \"$prefixes\":"
    printf '%s\n' "$bad" | sed 's/^/#   /'
    echo "# make them static, or give them the layer's prefix"
    exit 1
fi
