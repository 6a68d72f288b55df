#!/usr/bin/env python3
"""check_docs.py — the docs are code: run what they quote, and find what they name.

    docs/tools/check_docs.py [--build DIR] [--only commands|paths|form|flags] [FILE.md ...]

Four checks over README.md, docs/*.md and every folder's README.md, each
read as GitHub renders it: parsed as CommonMark by markdown-it-py (Debian's
python3-markdown-it; `./dev.sh docs-check` installs it), so a block is code
exactly where a reader sees code:

1. Quoted runs. A fenced block whose info string is `console check` is a
   transcript: each line starting with `$ ` is a command, run by bash from
   the repository root (with BUILD, the build folder, in the environment),
   and the lines after it, up to the next command, are output it must
   print (stdout and stderr together). Expected lines are matched in
   order against the output, skipping output lines in between; inside an
   expected line `…` matches any text, so a number that varies from run to
   run is written `…`, never quoted as exact. A line that is only `…`
   marks lines left out. Each block is one test.

2. Named paths. Every repository path a document names — a markdown link,
   a `path/with/slashes` or `file.c` in backticks, or a bare file.c or
   FILE.md in the text — must exist in the tree (a bare file name anywhere
   in it; `suite/test_name` without an extension is a test's name). This catches a file moved or
   renamed under the docs. Paths under build/ or /tmp, and names of other
   projects' files listed in NOT_OURS, are not checked.

3. Form (prose_rules.py beside this file): fences that do not close,
   `$ ` prompts inside sh blocks, "see 'X' below" where X is above,
   a figure's one run quoted in prose, a later chapter's term used
   without a word of what it is, and "all 1 ranks"-style grammar.

4. Flags. Every `--flag` README.md shows (in code or in backticks) is one
   the program it is given to lists in its --help (`-` and `_` alike): the
   program named before it in the same code span or line, else one the
   paragraph names, else any of ours (PROGRAMS; torchrun's are
   dtrain-launch's). Another tool's flags (OTHER_TOOLS) are not checked.
   An example with a flag its program does not take fails when pasted.
3-4 also run first on example pages (prose_rules.EXAMPLES): each rule must
   fail its page and pass the page mended.

Prints one line per failure and "N passed, N failed" last; exits 1 when any
failed. Cost: each quoted command runs once, each program's --help once; the
other checks read files only.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

import prose_rules

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Files other projects own that the docs name on purpose (llm.c, PyTorch), and
# files dtrain's programs write at run time.
NOT_OURS = {"llm.c", "prog.c", "script.py", "train_gpt2.c", "train_gpt2.py", "train_gpt2.cu", "distributed_c10d.py",
            "manifest.json"}

# Programs whose --help lists the flags README.md may show: name -> BUILD-relative path.
PROGRAMS = {"dtrain-launch": "launcher/dtrain-launch", "minigpt": "train/minigpt",
            "dtrain-ckpt": "checkpoint/dtrain-ckpt", "dtrain-bench": "bench/dtrain-bench",
            "minigpt-bench": "bench/minigpt-bench", "ckpt-bench": "bench/ckpt-bench",
            "loopback-streams": "bench/loopback-streams", "group-bench": "bench/group-bench",
            "p2p-pingpong": "bench/p2p-pingpong", "dtrain-demo": "examples/dtrain-demo"}
# Other tools README.md shows with their own flags (meson, pkg-config, …): not checked.
OTHER_TOOLS = ("meson", "pkg-config", "clang-format", "ninja", "readme_sample.py", "test_[a-z_]+")
# Flags README.md shows without naming a program, or for dtrain-launch's torchrun words.
OTHER_TOOLS_FLAGS = {"--no-python", "--monitor-interval", "--rdzv-backend", "--rdzv-endpoint",
                     "--help"}
PROGRAM_NAME = re.compile(r"(?<![\w-])(" + "|".join(
    [re.escape(p) for p in sorted(PROGRAMS, key=len, reverse=True)] + list(OTHER_TOOLS) +
    [r"dev\.sh", "torchrun"]) + r")(?![\w-])")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
TICKED = re.compile(r"`([^`\s]+)`")
TICKED_SPAN = re.compile(r"`([^`]+)`")
BARE = re.compile(r"(?<![\w/.`-])([\w-]+\.(?:c|h|cu|md|py|sh))\b(?![\w/-])")
TOP_DIRS = ("collectives", "model", "optim", "pipeline", "launcher", "train", "examples", "bench",
            "tests", "checkpoint", "docs", "install", ".ci")
FILE_EXT = re.compile(r"^[\w.+-]+\.(c|h|cu|cc|py|sh|md|sbatch|build|map|json|txt|png)$")


def documents(args_files):
    if args_files:
        return [os.path.abspath(f) for f in args_files]
    found = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for readme in sorted(glob.glob(os.path.join(ROOT, "*", "README.md"))):
        if readme not in found and "/build" not in readme:
            found.append(readme)
    return found


def check_blocks(path):
    """Yields (line number, body lines) for each `console check` block."""
    for t in prose_rules.parse(open(path, encoding="utf-8").read()):
        if t.type == "fence" and t.info.split()[:2] == ["console", "check"]:
            yield t.map[0] + 1, t.content.rstrip("\n").split("\n")


def transcript(body):
    """[(command, [expected lines])] from a block's lines."""
    runs = []
    for line in body:
        if line.startswith("$ "):
            runs.append((line[2:], []))
        elif runs and line.strip() and line.strip() != "…":
            runs[-1][1].append(line.rstrip())
    return runs


def line_pattern(expected):
    parts = [re.escape(p) for p in expected.split("…")]
    return re.compile("^" + ".*".join(parts) + r"\s*$")


def missing_lines(expected, output):
    """The first expected line not found, in order, in output; None when all are."""
    out = output.split("\n")
    pos = 0
    for want in expected:
        pat = line_pattern(want)
        while pos < len(out) and not pat.match(out[pos].rstrip()):
            pos += 1
        if pos == len(out):
            return want
        pos += 1
    return None


def run_block(build, body):
    env = dict(os.environ, BUILD=build, LC_ALL="C.UTF-8")
    for command, expected in transcript(body):
        try:
            p = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, timeout=300,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               encoding="utf-8", errors="replace")
        except subprocess.TimeoutExpired:
            return f"$ {command}: still running after 300 s"
        miss = missing_lines(expected, p.stdout)
        if miss is not None:
            tail = "\n    ".join(p.stdout.rstrip().split("\n")[-15:])
            return (f"$ {command} (exit {p.returncode}) did not print, in order:\n    {miss}\n"
                    f"  its output ended with:\n    {tail}")
    return None


def tree_files():
    p = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                       cwd=ROOT, stdout=subprocess.PIPE, encoding="utf-8", check=True)
    files = set(p.stdout.split())
    dirs = {os.path.dirname(f) for f in files}
    while True:
        more = {os.path.dirname(d) for d in dirs} - dirs
        if not more:
            break
        dirs |= more
    return files, dirs, {os.path.basename(f) for f in files}


def named_paths(path):
    """(line number, name, is_link) for every path-like name in a document."""
    text = open(path, encoding="utf-8").read()
    in_code = prose_rules.code_lines(prose_rules.parse(text))
    for n, line in enumerate(text.split("\n"), 1):
        if n in in_code:
            continue
        for m in LINK.finditer(line):
            if not re.match(r"^[a-z]+:", m.group(1)):
                yield n, m.group(1), True
        for m in TICKED.finditer(line):
            name = m.group(1).rstrip(".,:;)")
            first = name.split("/")[0]
            if "/" in name and first in TOP_DIRS or "/" not in name and FILE_EXT.match(name):
                yield n, name, False
        for m in BARE.finditer(TICKED.sub("", LINK.sub("]", line))):
            yield n, m.group(1), False


def path_exists(doc, name, is_link, files, dirs, basenames):
    if is_link:
        rel = os.path.relpath(os.path.normpath(os.path.join(os.path.dirname(doc), name)), ROOT)
        return rel in files or rel in dirs
    if "/" not in name:
        return name in basenames or name in NOT_OURS
    if "." not in name.split("/")[-1] and not name.endswith("/"):
        return True  # suite/test, a test's name
    name = name.rstrip("/")
    if any(c in name for c in "*?<>{}…") or "..." in name:
        return True  # a pattern, not one file
    for cand in (name, os.path.relpath(os.path.join(os.path.dirname(doc), name), ROOT)):
        if cand in files or cand in dirs:
            return True
    return False


def help_flags(build):
    """{program: every --flag its --help lists, '_' written '-'}."""
    flags = {}
    for name, prog in PROGRAMS.items():
        path = os.path.join(build, prog)
        if os.path.exists(path):
            p = subprocess.run([path, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               encoding="utf-8", errors="replace", timeout=60)
            flags[name] = {f.replace("_", "-") for f in FLAG.findall(p.stdout)} | {"--help"}
    flags["dev.sh"] = flags.get("minigpt", set())  # ./dev.sh demo [ARGS]: minigpt's
    flags["torchrun"] = flags.get("dtrain-launch", set())  # its command line runs as typed
    return flags


def flag_owner(flag, named, helps):
    """Whether a program among `named` (or, when none is named, any program) lists flag."""
    flag = flag.replace("_", "-")
    if not named:
        named = list(helps)
    if flag in OTHER_TOOLS_FLAGS or any(n not in helps for n in named):
        return True  # another tool's flag, not ours to check
    return any(flag in helps[n] for n in named)


def passages(text):
    """(first line, [(line, text)]) for each paragraph and each line of code, as CommonMark
    reads them; a flag belongs to a program its passage names."""
    for t in prose_rules.parse(text):
        if t.type in ("fence", "code_block"):
            first = t.map[0] + (2 if t.type == "fence" else 1)
            for k, line in enumerate(t.content.split("\n")):
                yield [(first + k, line)]
        elif t.type == "inline" and t.map:
            yield [(t.map[0] + 1 + k, line) for k, line in enumerate(t.content.split("\n"))]


def unknown_flags(path, helps):
    """(line, flag, programs) for every flag shown that the programs its passage names lack."""
    for passage in passages(open(path, encoding="utf-8").read()):
        whole = " ".join(line for _, line in passage)
        named = list(dict.fromkeys(n.group(1) for n in PROGRAM_NAME.finditer(whole)))
        code = len(passage) == 1 and not TICKED_SPAN.search(passage[0][1])
        for n, line in passage:
            spans = [line] if code else TICKED_SPAN.findall(line)
            for span in spans:
                for m in FLAG.finditer(span):
                    before = [p.group(1) for p in PROGRAM_NAME.finditer(span[: m.start()])]
                    owners = before[-1:] or named
                    if not flag_owner(m.group(0), owners, helps):
                        yield n, m.group(0), owners


def main():
    ap = argparse.ArgumentParser(description="Run the docs' quoted commands; find the paths they name.")
    ap.add_argument("--build", default="build", help="build folder (default build)")
    ap.add_argument("--only", choices=["commands", "paths", "form", "flags"])
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    build = os.path.abspath(os.path.join(ROOT, a.build)) if not os.path.isabs(a.build) else a.build
    passed = failed = 0
    files, dirs, basenames = tree_files()
    known = help_flags(build) if a.only in (None, "flags") else set()
    if a.only in (None, "form"):
        for rule, ok in prose_rules.self_check():
            print(f"{'ok  ' if ok else 'FAIL'} prose_rules.{rule}: fails its example page and "
                  "passes the page mended")
            passed += ok
            failed += not ok
    for doc in documents(a.files):
        rel = os.path.relpath(doc, ROOT)
        if a.only in (None, "form"):
            bad = prose_rules.check(rel, open(doc, encoding="utf-8").read())
            for n, why in bad:
                print(f"FAIL {rel}:{n}: {why}")
            failed += len(bad)
            passed += not bad
            if not bad:
                print(f"ok   {rel}: reads as CommonMark renders it, and its form rules hold")
        if a.only in (None, "flags") and rel == "README.md" and known:
            bad = list(unknown_flags(doc, known))
            for n, flag, owners in bad:
                print(f"FAIL {rel}:{n}: shows {flag}, which the --help of "
                      f"{' or '.join(owners) or 'no program'} does not list")
            failed += len(bad)
            passed += not bad
            if not bad:
                print(f"ok   {rel}: every flag it shows is one a program lists")
        if a.only in (None, "commands"):
            for start, body in check_blocks(doc):
                why = run_block(build, body)
                if why:
                    print(f"FAIL {rel}:{start}: {why}")
                    failed += 1
                else:
                    print(f"ok   {rel}:{start}")
                    passed += 1
        if a.only in (None, "paths"):
            bad = [(n, name) for n, name, link in named_paths(doc)
                   if not path_exists(doc, name, link, files, dirs, basenames)]
            for n, name in bad:
                print(f"FAIL {rel}:{n}: names '{name}', which is not in the tree")
            failed += len(bad)
            passed += not bad
            if not bad:
                print(f"ok   {rel}: every path it names exists")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
