#!/usr/bin/python3
"""GPT-2 tokenizer throughput: strata's C++ encoder against the npm package gpt-3-encoder@1.1.4
(GPT-2's encoder.py in JavaScript, on Node.js), on the same text in the same run.

  benchmarks/bench_tokenizer.py [--build build] [--rounds 3] [--out benchmarks/results]

The text: Debian's fortunes and the Jargon File (jargon-text), as pieces of at most 16 KiB cut
before a '\\n' that follows printable ASCII (gpt-3-encoder takes time worse than linear in a
string's length; pieces are its best case). Checks first that both give the same ids, then
times, alternating, `rounds` times each:
  - gpt-3-encoder on the pieces (one thread: Node runs JavaScript on one);
  - strata on the same pieces, one thread (tests/tokenizer/gpt2_encode, built with strata);
  - strata on the whole text, one thread and on every core (encode_parallel).
Prints the medians in MB/s (10^6 bytes of input per second) and the ratios, and writes them
with the date and the CPU to OUT/tokenizer-DATE.txt.
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tokenizer"))
import gpt2_vs_reference as ref  # noqa: E402  (the install, the cuts and the node driver)

TIMED_NODE = r"""
const {encode} = require(process.argv[2]);
const fs = require('fs');
const texts = fs.readFileSync(process.argv[3], 'utf-8').split('\n').filter(x => x)
  .map(f => fs.readFileSync(f, 'utf-8'));
const t0 = process.hrtime.bigint();
let n = 0;
for (const t of texts) n += encode(t).length;
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(JSON.stringify({seconds: s, tokens: n}));
"""


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def strata_mbs(encode, pkg, files, threads, work):
    out = subprocess.run([encode, pkg, str(threads), os.path.join(work, "bench.ids"), *files],
                         capture_output=True, text=True, check=True).stdout
    # "strata: X MB, 1 thread A MB/s, N threads B MB/s"
    parts = out.replace(",", "").split()
    return float(parts[5]), float(parts[9])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    encode = os.path.join(args.build, "tests", "tokenizer", "gpt2_encode")
    work = os.path.join(args.build, "gpt2-reference")
    os.makedirs(work, exist_ok=True)
    pkg = ref.install(work)

    texts = [(n, t) for n, t in ref.corpus(os.path.join(HERE, "..")) if n.startswith(("fortunes/", "jargon"))]
    text = "".join(t for _, t in texts)
    bdir = os.path.join(work, "bench")
    os.makedirs(bdir, exist_ok=True)
    whole = os.path.join(bdir, "whole.txt")
    ref.write(whole, text)
    pieces = []
    for k, piece in enumerate(ref.safe_cuts(text, ref.PIECE)):
        pieces.append(os.path.join(bdir, f"{k}.txt"))
        ref.write(pieces[-1], piece)
    mb = len(text.encode()) / 1e6
    cores = len(os.sched_getaffinity(0))

    # Validate before timing: the same ids from both.
    node_ids = [x for ids in ref.run_node(pkg, [pieces], bdir) for x in ids]
    subprocess.run([encode, pkg, "1", os.path.join(bdir, "strata.ids"), whole], check=True, capture_output=True)
    with open(os.path.join(bdir, "strata.ids")) as f:
        if [int(x) for x in f.read().split()] != node_ids:
            sys.exit("FAIL: strata's ids differ from gpt-3-encoder's; not timing")

    script = os.path.join(bdir, "timed.js")
    ref.write(script, TIMED_NODE)
    lst = os.path.join(bdir, "pieces.txt")
    ref.write(lst, "\n".join(pieces) + "\n")
    node, ours_pieces, ours_one, ours_all = [], [], [], []
    for _ in range(args.rounds):
        r = subprocess.run(["node", script, pkg, lst], capture_output=True, text=True, check=True)
        node.append(mb / json.loads(r.stdout)["seconds"])
        ours_pieces.append(strata_mbs(encode, pkg, pieces, 1, bdir)[0])
        one, many = strata_mbs(encode, pkg, [whole], cores, bdir)
        ours_one.append(one)
        ours_all.append(many)
    med = {k: statistics.median(v) for k, v in
           [("node", node), ("pieces", ours_pieces), ("one", ours_one), ("all", ours_all)]}
    date = datetime.date.today().isoformat()
    lines = [
        f"# GPT-2 tokenizer throughput, {date}, {cpu_name()}, {cores} cores usable, load average "
        f"{os.getloadavg()[0]:.1f} at the end",
        f"# text: fortunes + jargon, {mb:.2f} MB, {len(pieces)} pieces of <= 16 KiB; ids checked equal first;",
        f"# medians of {args.rounds} alternating rounds (rounds: gpt-3-encoder {[round(x, 2) for x in node]}, "
        f"strata 1 thread {[round(x, 1) for x in ours_pieces]}, strata {cores} threads {[round(x, 1) for x in ours_all]})",
        f"gpt-3-encoder 1.1.4 (Node.js {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()}), "
        f"pieces, 1 thread: {med['node']:.2f} MB/s",
        f"strata, the same pieces, 1 thread: {med['pieces']:.1f} MB/s ({med['pieces'] / med['node']:.1f}x gpt-3-encoder)",
        f"strata, whole text, 1 thread: {med['one']:.1f} MB/s ({med['one'] / med['node']:.1f}x)",
        f"strata, whole text, {cores} threads: {med['all']:.1f} MB/s ({med['all'] / med['one']:.2f}x one thread)",
    ]
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"tokenizer-{date}.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
