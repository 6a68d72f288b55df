#!/usr/bin/env python3
"""check_file_calls.py — no two files of a layer call each other, directly
or around a loop: the object files of the layer's archive, linked by "calls
a function the other defines" (nm -A), form no cycle. A layer then reads
bottom up: each file stands only on the files below it.

    check_file_calls.py LAYER ARCHIVE [PENDING]

PENDING: a file of object names (allreduce_ring.c.o, one a line, #
comments) known to sit on a loop and scheduled for untangling; a loop made
only of pending files is tolerated, any other fails. Prints TAP: one test.
"""
import subprocess
import sys


def call_graph(archive):
    out = subprocess.run(["nm", "-A", archive], capture_output=True, text=True,
                         check=True).stdout
    defined, wanted = {}, {}
    for line in out.splitlines():
        where, _, rest = line.rpartition(":")
        obj = where.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
        parts = rest.split()
        if len(parts) == 2 and parts[0] == "U":
            wanted.setdefault(obj, set()).add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRCVWGi":
            defined[parts[2]] = obj
            wanted.setdefault(obj, set())
    return {obj: {defined[s] for s in syms if s in defined and defined[s] != obj}
            for obj, syms in wanted.items()}


def loops(graph):
    """Strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main():
    layer, archive = sys.argv[1], sys.argv[2]
    pending = set()
    if len(sys.argv) > 3:
        for line in open(sys.argv[3]):
            name = line.split("#", 1)[0].strip()
            if name:
                pending.add(name)
    print("1..1")
    graph = call_graph(archive)
    bad = [c for c in loops(graph) if not set(c) <= pending]
    if not bad:
        where = f" but the {len(pending)} pending ones" if pending else ""
        print(f"ok 1 - {layer}: no two files{where} call each other "
              f"({len(graph)} files)")
        return 0
    print(f"not ok 1 - {layer}: files that call each other around a loop:")
    for comp in bad:
        print("#   " + ", ".join(comp))
        for a in comp:
            for b in sorted(graph[a] & set(comp)):
                print(f"#     {a} -> {b}")
    print("# move what both need into a file below both")
    return 1


if __name__ == "__main__":
    sys.exit(main())
