#!/usr/bin/python3
"""Folders are the layers: no include runs from a lower folder of src/ to a higher one.

src/README.md lists src/'s folders, lowest first (lines "N. `folder/` ..."); a file may include
headers of its own folder and of the folders listed before it. Private headers live beside
their sources and are included as "folder/name.h"; the public seams (include/strata) belong to
the folder of their implementation (tensor.h: base, comm.h: comm, backend.h: backends ...), or
to the lowest when they have none (ops.def, the kernels' headers, cuda_module.h). kernels/ is
below every folder of src/: it may include only public headers of the lowest folder. A folder
of src/ that the README does not list, or a file in src/ itself, fails the check: a new folder
is placed on purpose.

    include_layers.py [REPO]        exit 0, or 1 listing each upward include and misplaced file
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
LISTED = re.compile(r"^\d+\.\s+`(\w+)/`", re.M)


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    order = LISTED.findall(open(os.path.join(repo, "src", "README.md"), encoding="utf-8").read())
    level = {f: i for i, f in enumerate(order)}
    problems = []
    src = os.path.join(repo, "src")
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if os.path.isdir(path) and name not in level:
            problems.append(f"src/{name}/: a folder src/README.md does not list")
        elif os.path.isfile(path) and name != "README.md":
            problems.append(f"src/{name}: a file directly in src/ (it belongs in a layer's folder)")
    # The public headers' folders: that of the .cpp of the same name, else the lowest.
    impl = {}
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith(".cpp"):
                impl[f[:-4]] = os.path.relpath(root, src).split(os.sep)[0]
    public = {}
    for f in os.listdir(os.path.join(repo, "include", "strata")):
        public[f] = impl.get(f.rsplit(".", 1)[0], order[0])

    def folder_of(rel):  # the layer of a file, by its path
        parts = rel.split(os.sep)
        if parts[0] == "src":
            return parts[1]
        if parts[0] == "include":
            return public[parts[-1]]
        return None  # kernels/: below src/

    files = 0
    for top in ("src", "include/strata", "kernels"):
        for root, _, names in os.walk(os.path.join(repo, top)):
            for f in sorted(names):
                if not f.endswith((".h", ".cpp", ".cu", ".cuh", ".def")):
                    continue
                rel = os.path.relpath(os.path.join(root, f), repo)
                mine = folder_of(rel)
                if mine is not None and mine not in level:
                    continue  # reported above
                files += 1
                text = open(os.path.join(root, f), encoding="utf-8").read()
                for inc in INCLUDE.findall(text):
                    if os.path.exists(os.path.join(root, inc)):
                        continue  # beside it: its own folder
                    if inc.startswith("strata/"):
                        theirs = public.get(inc.split("/", 1)[1])
                        if theirs is None:
                            problems.append(f"{rel}: includes {inc}, which is not in include/strata")
                            continue
                    else:
                        theirs = inc.split("/", 1)[0]
                        if "/" not in inc or theirs not in level:
                            problems.append(f"{rel}: includes \"{inc}\", which is no folder/name.h of src/")
                            continue
                        if mine is None:
                            problems.append(f"{rel} (kernels) includes {inc}: kernels/ includes public headers only")
                            continue
                    if mine is None:
                        if level[theirs] > 0:
                            problems.append(f"{rel} (kernels) includes {inc} ({theirs}): upward")
                    elif level[theirs] > level[mine]:
                        problems.append(f"{rel} ({mine}) includes {inc} ({theirs}): upward")
    for p in problems:
        print(p)
    print(f"{files} files checked over {len(order)} folders ({' < '.join(order)}): "
          f"{'no include runs upward' if not problems else f'{len(problems)} problems'}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
