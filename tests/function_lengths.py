#!/usr/bin/python3
"""The longest functions in src/ and kernels/, measured by Universal Ctags (ctags-universal, Debian universal-ctags: first line to the
closing brace, lambdas counted in the function that holds them).

    function_lengths.py [REPO] [--top N] [--max LINES]

Prints the N longest (default 10); exits 1 when one is longer than --max (default 120).
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
    out = subprocess.run(["ctags-universal", "--output-format=json", "--fields=+ne", "--c++-kinds=f",
                          "--language-force=C++", "-o", "-"] + sorted(files),
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        t = json.loads(line)
        if t.get("kind") != "function" or "end" not in t or t["name"].startswith("__anon"):
            continue
        name = t["name"] if "scope" not in t else f'{t["scope"]}::{t["name"]}'
        yield t["end"] - t["line"] + 1, os.path.relpath(t["path"], repo), t["line"], name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--max", type=int, default=120)
    a = ap.parse_args()
    found = sorted(functions(os.path.abspath(a.repo)), reverse=True)
    for n, path, line, name in found[:a.top]:
        print(f"{n:5d}  {path}:{line}  {name}")
    over = [f for f in found if f[0] > a.max]
    print(f"{len(found)} functions; {len(over)} longer than {a.max} lines")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
