#!/usr/bin/python3
"""Every relative link of the documentation resolves: README.md, docs/*.md, benchmarks/README.md
(and any other Markdown file named on the command line). A link [text](path) or
[text](path#anchor) must name a file or directory of the repository; an anchor, a heading of
the target (GitHub's slugs: lower case, punctuation dropped, spaces to hyphens, -1, -2 ... for
repeats). Links with a scheme (https:, mailto:) are not checked; code spans and code blocks are
not links.

    doc_links.py [REPO] [FILE.md ...]     exit 0, or 1 listing each broken link
"""
import glob
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def prose_lines(text):
    """The lines outside fenced and indented code blocks, with code spans blanked."""
    fenced = code = False
    prev = ""
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        # An indented code block starts after a blank line (a list item's continuation does not).
        code = line.startswith("    ") and (code or not prev.strip())
        prev = line
        if fenced or code:
            continue
        yield n, re.sub(r"`[^`]*`", "``", line)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)  # a link in a heading: its text
    s = re.sub(r"[^\w\- ]", "", s)                    # punctuation (backticks, dots, colons ...)
    return s.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    fenced = False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            out.add(base if k == 0 else f"{base}-{k}")
            seen[base] = k + 1
    return out


def check(repo, md):
    problems = []
    text = open(md, encoding="utf-8").read()
    for n, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = md if not path else os.path.normpath(os.path.join(os.path.dirname(md), path))
            where = f"{os.path.relpath(md, repo)}:{n}: {target}"
            if not os.path.realpath(dest).startswith(os.path.realpath(repo) + os.sep):
                problems.append(f"{where}: outside the repository")
            elif not os.path.exists(dest):
                problems.append(f"{where}: no {os.path.relpath(dest, repo)}")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{where}: no heading #{anchor} in {os.path.relpath(dest, repo)}")
    return problems


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    files = [os.path.abspath(f) for f in sys.argv[2:]] or (
        [os.path.join(repo, "README.md"), os.path.join(repo, "benchmarks", "README.md")] +
        sorted(glob.glob(os.path.join(repo, "docs", "*.md"))))
    problems = []
    for md in files:
        problems += check(repo, md)
    for p in problems:
        print(p)
    print(f"{len(files)} files, {len(problems)} broken links")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
