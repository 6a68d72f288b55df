"""prose_rules.py — the docs' form, read as GitHub renders them (CommonMark).

check_docs.py runs these rules over every document; each yields
(line, message) for what a reader would trip on. The document is parsed
by markdown-it-py in its strict CommonMark mode (Debian's
python3-markdown-it), so a code block is where CommonMark says it is,
not where a line-by-line guess puts it: a line like "``` Some text" does
not close a fence (a closing fence has nothing after it), and everything
after it renders as code. The rules:

- fence_text: a fence that a line of text after "```" fails to close, or
  one never closed at all.
- shell_prompts: a `sh`/`bash`/`shell` block holds commands to copy and
  paste, so a `$ ` prompt (and the output that goes with it) does not
  belong in one; a transcript is a `console` block.
- see_where: "see 'Heading' below" must point the way the heading lies.
- one_run_quoted: prose beside a figure that `./dev.sh figures` redraws
  must not quote the number of the one run drawn ("in the run drawn here
  … 128 KiB"): the next run draws another; state the range over runs, or
  mark the number in the figure itself.
- forward_terms: a term a later chapter introduces (1F1B, ZB-H1, GPipe,
  micro-batch, --tp) is, where an earlier chapter first uses it, in a
  paragraph that says what it is and points to that chapter.
- grammar: "all 1 ranks" and "a env://" ("a" before a vowel), which
  programs print when a count or a name is filled in without care.

Cost: one parse per document; the rules walk its tokens once each.
"""
import re

from markdown_it import MarkdownIt

SHELLS = {"sh", "bash", "shell", "zsh"}
FENCE_WITH_TEXT = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*(\S.*)$")
SEE = re.compile(r"""\bsee\s+(?:["“'‘]([^"”'’]+)["”'’]|\[([^\]]+)\]\(#[^)\s]*\))\s*,?\s*"""
                 r"""(below|above)\b""", re.I)
ONE_RUN = re.compile(r"\b(?:run|one|figure) (?:drawn|shown|plotted) here\b|\bdrawn here\b", re.I)
QUANTITY = re.compile(r"\d+(?:\.\d+)?\s*(?:[KMG]i?B|[mµu]s|GB/s|%)(?!\w)")
# Figures whose numbers are timings of the run that drew them.
MEASURED_FIGURES = ("busbw.png", "bubble.png", "gantt.png", "curves.png")
# term: (the chapter that introduces it, how its file name starts)
LATER_TERMS = {
    "GPipe": (9, "09-"),
    "1F1B": (9, "09-"),
    "ZB-H1": (9, "09-"),
    "micro-batch": (9, "09-"),
    "--tp": (14, "14-"),
}
ALL_ONE = re.compile(r"\ball 1 [a-z]+s\b")
A_VOWEL = re.compile(r"\ba `?(?!one\b|once\b)[aeioAEIO][\w:/]*")


def parse(text):
    return MarkdownIt("commonmark").parse(text)


def code_lines(tokens):
    """1-based numbers of every line inside a code block, fences included."""
    lines = set()
    for t in tokens:
        if t.type in ("fence", "code_block") and t.map:
            lines.update(range(t.map[0] + 1, t.map[1] + 1))
    return lines


def fence_text(lines, tokens):
    for t in tokens:
        if t.type != "fence":
            continue
        opener = t.markup
        body = t.content.split("\n")
        for k, line in enumerate(body):
            m = FENCE_WITH_TEXT.match(line)
            if m and m.group(1)[0] == opener[0] and len(m.group(1)) >= len(opener):
                yield (t.map[0] + 2 + k,
                       f"'{line.strip()[:40]}' does not close the block opened at line "
                       f"{t.map[0] + 1}: a closing fence has nothing after it, so "
                       "CommonMark renders the rest as code; end the fence, then the text")
                break
        else:
            last = lines[t.map[1] - 1].strip() if t.map[1] - 1 < len(lines) else ""
            if t.map[1] - 1 == t.map[0] or not last.startswith(opener) or last.strip("`~"):
                yield t.map[0] + 1, "this code block is never closed: the rest renders as code"


def shell_prompts(lines, tokens):
    for t in tokens:
        if t.type == "fence" and t.info.split()[:1] and t.info.split()[0] in SHELLS:
            for k, line in enumerate(t.content.split("\n")):
                if line.startswith("$ "):
                    yield (t.map[0] + 2 + k,
                           f"a '$ ' prompt in a {t.info.split()[0]} block: pasted, it runs "
                           "'$' and any output quoted with it; keep commands only, or make "
                           "it a console block")
                    break


def headings(tokens):
    """{normalised title: 1-based line} of every heading."""
    found = {}
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            found.setdefault(norm(tokens[i + 1].content), t.map[0] + 1)
    return found


def norm(title):
    return re.sub(r"[^a-z0-9 ]", "", title.lower().replace("`", "")).strip()


def inline_blocks(tokens):
    """(first line, text) of every paragraph, list item, table cell and heading."""
    for t in tokens:
        if t.type == "inline" and t.map:
            yield t.map[0] + 1, t.content


def see_where(lines, tokens):
    heads = headings(tokens)
    for first, text in inline_blocks(tokens):
        for m in SEE.finditer(text):
            title = m.group(1) or m.group(2)
            at = heads.get(norm(title))
            if at is None:
                continue
            line = first + text[: m.start()].count("\n")
            if (m.group(3).lower() == "below") != (at > line):
                yield (line, f"says '{title}' is {m.group(3).lower()}, but that section is "
                       f"{'below' if at > line else 'above'} (line {at})")


def one_run_quoted(lines, tokens):
    measured = False
    for t in tokens:
        if t.type == "heading_open":
            measured = False
        if t.type != "inline" or not t.map:
            continue
        if any(f in t.content for f in MEASURED_FIGURES) and "![" in t.content:
            measured = True
            continue
        if measured and ONE_RUN.search(t.content) and QUANTITY.search(t.content):
            yield (t.map[0] + 1,
                   "quotes a number of the one run a figure draws, which ./dev.sh figures "
                   "redraws: state the range over runs, or mark it in the figure")


def chapter_number(path):
    m = re.match(r"(\d\d)-", path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def forward_terms(lines, tokens, path):
    here = chapter_number(path)
    if here is None:
        return
    seen = set()
    for first, text in inline_blocks(tokens):
        for term, (chapter, prefix) in LATER_TERMS.items():
            if chapter <= here or term in seen:
                continue
            pat = re.compile(r"(?<![\w-])" + re.escape(term) + r"(?:e?s)?(?![\w])")
            m = pat.search(text)
            if not m:
                continue
            seen.add(term)
            if not re.search(rf"\bchapter {chapter}\b|\({prefix}[\w-]*\.md", text, re.I):
                line = first + text[: m.start()].count("\n")
                yield (line, f"first use of '{term}', which chapter {chapter} introduces: say "
                       f"what it is here and point to chapter {chapter}, or use it later")


def grammar(lines, tokens):
    for n, line in enumerate(lines, 1):
        for pat, why in ((ALL_ONE, "a count of 1 with a plural"), (A_VOWEL, "'a' before a vowel")):
            m = pat.search(line)
            if m:
                yield n, f"'{m.group(0)}': {why}"


# One page each rule must fail, and the same page mended, which it must pass:
# check_docs.py runs them first, so a rule that can no longer fail is seen.
EXAMPLES = [
    ("fence_text", "docs/01-x.md", "```sh\nls\n``` Then text.\n\nMore.\n",
     "```sh\nls\n```\n\nThen text.\n"),
    ("fence_text", "docs/01-x.md", "Text.\n\n```\nnever closed\n",
     "Text.\n\n```\nclosed\n```\n"),
    ("shell_prompts", "docs/01-x.md", "```sh\n$ ls\nfile.c\n```\n",
     "```sh\nls\n```\n\n```console\n$ ls\nfile.c\n```\n"),
    ("see_where", "docs/01-x.md", "## Setup\n\nText.\n\n## Use\n\nSee \"Setup\" below.\n",
     "## Setup\n\nText.\n\n## Use\n\nSee \"Setup\" above.\n"),
    ("one_run_quoted", "docs/01-x.md",
     "## Speed\n\n![busbw](figures/busbw.png)\n\nIn the run drawn here it won from 128 KiB.\n",
     "## Speed\n\n![busbw](figures/busbw.png)\n\nOver runs it won from 128 KiB to 1 MiB.\n"),
    ("forward_terms", "docs/06-x.md", "Under 1F1B the stages overlap.\n",
     "Under 1F1B, a pipeline schedule (chapter 9), the stages overlap.\n"),
    ("grammar", "docs/01-x.md", "```\nreplicas: all 1 ranks agree\n```\n",
     "```\nreplicas: 1 rank holds them\n```\n"),
    ("grammar", "docs/01-x.md", "Start a env:// store.\n", "Start an env:// store.\n"),
]


def self_check():
    """[(rule, ok)]: each example page fails and its mended page passes."""
    return [(rule, bool(check(path, bad)) and not check(path, good))
            for rule, path, bad, good in EXAMPLES]


def check(path, text):
    """[(line, message)] for one document."""
    lines = text.split("\n")
    tokens = parse(text)
    found = []
    for rule in (fence_text, shell_prompts, see_where, one_run_quoted, grammar):
        found += list(rule(lines, tokens))
    found += list(forward_terms(lines, tokens, path))
    return sorted(found)
