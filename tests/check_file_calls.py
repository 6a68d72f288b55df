#!/usr/bin/env python3
"""check_file_calls.py — no two files of a layer call each other, directly
or around a loop: the object files of the layer's archive, linked by "calls
a function the other defines" (nm -A), form no cycle. A layer then reads
bottom up: each file stands only on the files below it.

    check_file_calls.py LAYER ARCHIVE|PROGRAM [PENDING] [--rooms DIR]

PENDING: a file of object names (allreduce_ring.c.o, one a line, #
comments) known to sit on a loop and scheduled for untangling; a loop made
only of pending files is tolerated, any other fails.

--rooms DIR: the layer's source folder, whose sub-folders are its rooms
(collectives/: transport/, algorithms/, ...) and whose own files are the
room on top (the communicator). Two more tests then: no two rooms call
each other, directly or around a loop; and no room calls up into the top
folder (what a lower room reports goes up through what the top handed
down to it). Meson names the object of sub/file.c, built by the layer's
own library, "sub_file.c.o"; a room that builds an archive of its own,
joined whole into the layer's, has its objects under its own build folder.

With --rooms a fourth: each function a room's header declares is defined
in that room (the top folder's headers are the layer's API, declaring
every room's functions) (a declaration in base/dt_status.h whose body sits in dtypes/
makes every includer of the one depend, unseen, on the other).

And a fifth, read from the sources: includes run one way, as calls do. No
file of a room includes a header of the top folder other than its public
ones (dt_*.h): a room that included the communicator's own header
(comm_internal.h) could reach into its struct, and the floors would hold
for calls only. Nor do the rooms include each other's headers around a
loop. A header is found by its name, as the compiler finds it (every
folder of the layer is on its include path).

Prints TAP: one test, or five with --rooms.
"""
import glob
import os
import re
import subprocess
import sys

# A function's declaration at the start of a header's line: "type name(".
DECLARED = re.compile(r"^(?!static\b|typedef\b|return\b|extern\s+\"|#)[A-Za-z_][\w \t*]*?\b"
                      r"([a-z_][a-z0-9_]*)\s*\(")


def objects_of(archive):
    return [archive] if archive.endswith(".a") else sorted(
        glob.glob(os.path.join(glob.escape(archive + ".p"), "*.o")))


def definitions(archive):
    """{function: the object (member path) that defines it}."""
    out = subprocess.run(["nm", "-A"] + objects_of(archive), capture_output=True, text=True,
                         check=True).stdout
    found = {}
    for line in out.splitlines():
        where, _, rest = line.rpartition(":")
        parts = rest.split()
        if len(parts) == 3 and parts[1] == "T":
            found[parts[2]] = where.rsplit(":", 1)[-1]
    return found


def declarations(top):
    """[(room, header path, function)] for every function a header declares."""
    found = []
    for folder, _, names in sorted(os.walk(top)):
        rel = os.path.relpath(folder, top)
        room = "." if rel == "." else rel.split(os.sep)[0]
        for name in sorted(n for n in names if n.endswith(".h")):
            path = os.path.join(folder, name)
            for line in open(path, encoding="utf-8"):
                m = DECLARED.match(line)
                if m:
                    found.append((room, os.path.relpath(path, top), m.group(1)))
    return found


def check_homes(layer, archive, rooms, top):
    """Test 4: a function lives in the room whose header declares it."""
    defined = definitions(archive)
    away = []
    for room, header, fn in declarations(top):
        if room == ".":
            continue  # the layer's public headers declare every room's API
        obj = defined.get(fn)
        if obj in rooms and rooms[obj][0] != room:
            away.append((header, fn, rooms[obj][1]))
    if not away:
        print(f"ok 4 - {layer}: each function a room's header declares is defined in that room")
        return 0
    print(f"not ok 4 - {layer}: functions declared in one room and defined in another:")
    for header, fn, source in away:
        print(f"#   {fn}: declared in {header}, defined in {source}")
    print("# move the definition beside its declaration (or the declaration beside it)")
    return 1


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def includes(top):
    """[(room, source path, room of the header, header name)] for every
    #include "..." of a header the layer's folders hold."""
    home, found = {}, []
    for folder, _, names in os.walk(top):
        rel = os.path.relpath(folder, top)
        for name in names:
            if name.endswith((".h", ".cuh")):
                home[name] = "." if rel == "." else rel.split(os.sep)[0]
    for folder, _, names in sorted(os.walk(top)):
        rel = os.path.relpath(folder, top)
        room = "." if rel == "." else rel.split(os.sep)[0]
        for name in sorted(names):
            if not name.endswith((".c", ".h", ".cu", ".cuh", ".cc")):
                continue
            path = os.path.join(folder, name)
            for line in open(path, encoding="utf-8", errors="replace"):
                m = INCLUDE.match(line)
                header = m and os.path.basename(m.group(1))
                if header in home:
                    found.append((room, os.path.relpath(path, top), home[header], header))
    return found


def check_includes(layer, top):
    """Test 5: no room includes the top folder's private headers, and the
    rooms' includes form no loop."""
    found = includes(top)
    up = [(src, h) for room, src, hroom, h in found
          if room != "." and hroom == "." and not h.startswith("dt_")]
    graph = {}
    for room, src, hroom, h in found:
        if room != "." and hroom not in (".", room):
            graph.setdefault(room, set()).add(hroom)
            graph.setdefault(hroom, set())
    bad = loops(graph)
    if not up and not bad:
        print(f"ok 5 - {layer}: includes run one way: no room includes the top folder's "
              f"own headers, the rooms' includes form no loop")
        return 0
    print(f"not ok 5 - {layer}: includes that run up or around:")
    for src, h in up:
        print(f"#   {src} includes {h}, a header of the top folder's own")
    for comp in bad:
        for r in comp:
            for src, h in sorted((src, h) for room, src, hroom, h in found
                                 if room == r and hroom in comp and hroom != r):
                print(f"#   {src} includes {h} (rooms {', '.join(comp)} around a loop)")
    print("# give the room a state of its own and hand it what it needs (plain fields, "
          "a table of functions), as the transport's dt_transport does")
    return 1


def call_graph(archive):
    """ARCHIVE is a static library, or a program: then its objects, in the
    folder meson keeps them in beside it (PROGRAM.p/)."""
    files = objects_of(archive)
    if not files:
        sys.exit(f"check_file_calls.py: no objects for {archive}")
    out = subprocess.run(["nm", "-A"] + files, capture_output=True, text=True,
                         check=True).stdout
    defined, wanted = {}, {}
    for line in out.splitlines():
        where, _, rest = line.rpartition(":")
        obj = where.rsplit(":", 1)[-1]  # the member's path: unique
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


def rooms_of(top, archive, objects):
    """Object (member path) -> (room, source path); room "." for the top
    folder's files. Objects the layer's own library built sit in its
    private folder, named for their source path with "/" as "_"; those of
    a room's own archive sit under that room's build folder."""
    flat = {}
    for folder, _, names in os.walk(top):
        rel = os.path.relpath(folder, top)
        for name in names:
            if name.endswith((".c", ".cu", ".cc")):
                path = name if rel == "." else os.path.join(rel, name)
                room = "." if rel == "." else rel.split(os.sep)[0]
                flat[path.replace(os.sep, "_") + ".o"] = (room, path)
    home = os.path.dirname(os.path.abspath(archive))
    rooms = {}
    for obj in objects:
        name = os.path.basename(obj)
        under = os.path.relpath(os.path.dirname(os.path.abspath(obj)), home)
        first = under.split(os.sep)[0]
        if first.endswith(".p") or first == ".":
            if name in flat:
                rooms[obj] = flat[name]
        elif not first.startswith(".."):
            rooms[obj] = (first, os.path.join(first, name[:-len(".o")]))
    return rooms


def floors(graph):
    """Each node's floor in an acyclic graph: 0 for one that calls none,
    else one above the highest it calls."""
    floor = {}

    def visit(v):
        if v not in floor:
            floor[v] = 0
            floor[v] = 1 + max((visit(w) for w in graph[v]), default=-1)
        return floor[v]

    for v in graph:
        visit(v)
    return floor


def check_files(n, layer, graph, pending, name):
    bad = [c for c in loops(graph) if not set(c) <= pending]
    if not bad:
        where = f" but the {len(pending)} pending ones" if pending else ""
        print(f"ok {n} - {layer}: no two files{where} call each other "
              f"({len(graph)} files)")
        return 0
    print(f"not ok {n} - {layer}: files that call each other around a loop:")
    for comp in bad:
        print("#   " + ", ".join(name(a) for a in comp))
        for a in comp:
            for b in sorted(graph[a] & set(comp)):
                print(f"#     {name(a)} -> {name(b)}")
    print("# move what both need into a file below both")
    return 1


def check_rooms(layer, graph, rooms, rooms_top):
    """Tests 2 and 3: the rooms' graph has no loop; nothing calls the top."""
    unknown = sorted(o for o in graph if o not in rooms)
    if unknown:
        print(f"not ok 2 - {layer}: objects with no source file under the "
              f"layer's folder: {', '.join(os.path.basename(o) for o in unknown)}")
        print(f"not ok 3 - {layer}: rooms unknown")
        return 1
    room = {o: rooms[o][0] for o in graph}
    calls = {}  # room -> {room it calls: [(file, file), ...]}
    for a, bs in graph.items():
        calls.setdefault(room[a], {})
        for b in bs:
            if room[b] != room[a]:
                calls[room[a]].setdefault(room[b], []).append((a, b))
    rgraph = {r: set(cs) for r, cs in calls.items()}
    rc = 0
    bad = loops(rgraph)
    if bad:
        rc = 1
        print(f"not ok 2 - {layer}: rooms that call each other around a loop:")
        for comp in bad:
            for r in comp:
                for q in sorted(rgraph[r] & set(comp)):
                    for a, b in sorted(calls[r][q]):
                        print(f"#   {rooms[a][1]} -> {rooms[b][1]}")
        print("# hand the lower room what it needs (a table of functions) "
              "instead of calling up")
    else:
        fl = floors(rgraph)
        top = os.path.basename(os.path.normpath(rooms_top)) + "/"
        picture = " < ".join(
            ", ".join(sorted(top if r == "." else r + "/" for r in fl if fl[r] == f))
            for f in range(max(fl.values()) + 1))
        print(f"ok 2 - {layer}: no two rooms call each other "
              f"({len(rgraph)} rooms on {max(fl.values()) + 1} floors: "
              f"{picture})")
    up = sorted((a, b) for a, bs in graph.items() for b in bs
                if room[b] == "." and room[a] != ".")
    if up:
        rc = 1
        print(f"not ok 3 - {layer}: rooms calling up into the top folder:")
        for a, b in up:
            print(f"#   {rooms[a][1]} -> {rooms[b][1]}")
        print("# report up through what the top hands down (a table of "
              "functions), not by calling it")
    else:
        print(f"ok 3 - {layer}: no room calls up into the top folder")
    return rc


def main():
    args = sys.argv[1:]
    top = None
    if "--rooms" in args:
        i = args.index("--rooms")
        top = args[i + 1]
        del args[i:i + 2]
    layer, archive = args[0], args[1]
    pending = set()
    if len(args) > 2:
        for line in open(args[2]):
            name = line.split("#", 1)[0].strip()
            if name:
                pending.add(name)
    graph = call_graph(archive)
    pending = {o for o in graph if os.path.basename(o) in pending}
    if top is None:
        print("1..1")
        return check_files(1, layer, graph, pending, os.path.basename)
    rooms = rooms_of(top, archive, graph)
    print("1..5")
    rc = check_files(1, layer, graph, pending,
                     lambda o: rooms[o][1] if o in rooms else os.path.basename(o))
    rc |= check_rooms(layer, graph, rooms, top)
    rc |= check_homes(layer, archive, rooms, top)
    return check_includes(layer, top) | rc


if __name__ == "__main__":
    sys.exit(main())
