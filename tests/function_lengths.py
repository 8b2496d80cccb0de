#!/usr/bin/python3
"""The longest functions and the largest classes in src/ and kernels/, measured by Universal
Ctags (ctags-universal, Debian universal-ctags): a function from its first line to its closing
brace, lambdas counted in the function that holds them; a class as the lines of its member
functions, defined inside it or out of line (a nested class counts apart).

    function_lengths.py [REPO] [--top N] [--max LINES] [--max-class LINES]

Prints the N longest functions and the N largest classes (default 10); exits 1 when a
function is longer than --max (default 120) or a class larger than --max-class (default 300).
"""
import argparse
import json
import os
import subprocess
import sys


def functions(repo):
    files = []
    for d in ("src", "kernels"):
        for root, _, names in os.walk(os.path.join(repo, d)):
            files += [os.path.join(root, n) for n in names if n.endswith((".cpp", ".cu", ".h", ".cuh"))]
    out = subprocess.run(["ctags-universal", "--output-format=json", "--fields=+neK", "--c++-kinds=f",
                          "--language-force=C++", "-o", "-"] + sorted(files),
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        t = json.loads(line)
        if t.get("kind") != "function" or "end" not in t or t["name"].startswith("__anon"):
            continue
        name = t["name"] if "scope" not in t else f'{t["scope"]}::{t["name"]}'
        cls = t["scope"] if t.get("scopeKind") in ("class", "struct") else None
        yield t["end"] - t["line"] + 1, os.path.relpath(t["path"], repo), t["line"], name, cls


def class_sizes(found):
    """(lines of member functions, class, files) for every class, largest first."""
    size, files = {}, {}
    for n, path, _, _, cls in found:
        if cls:
            size[cls] = size.get(cls, 0) + n
            files.setdefault(cls, set()).add(path)
    return sorted(((n, c, sorted(files[c])) for c, n in size.items()), reverse=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--max", type=int, default=120)
    ap.add_argument("--max-class", type=int, default=300)
    a = ap.parse_args()
    found = sorted(functions(os.path.abspath(a.repo)), reverse=True)
    for n, path, line, name, _ in found[:a.top]:
        print(f"{n:5d}  {path}:{line}  {name}")
    over = [f for f in found if f[0] > a.max]
    print(f"{len(found)} functions; {len(over)} longer than {a.max} lines")
    classes = class_sizes(found)
    for n, cls, files in classes[:a.top]:
        print(f"{n:5d}  class {cls}  ({', '.join(files)})")
    big = [c for c in classes if c[0] > a.max_class]
    print(f"{len(classes)} classes; {len(big)} larger than {a.max_class} lines of member functions")
    sys.exit(1 if over or big else 0)


if __name__ == "__main__":
    main()
