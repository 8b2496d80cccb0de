#!/usr/bin/python3
"""`strata bench comm` on 2 ranks beside a plain MPI reference (tests/plan/comm_reference.cpp:
MPI_Allreduce, MPI_Iallreduce + MPI_Wait, the pairwise sum on MPI_Isend/MPI_Irecv and a
ping-pong, nothing of strata's).

First one whole `strata bench comm` run (8 B to --max_bytes, every op): its table and fit. Then,
size by size, strata and the reference launched alternately (which goes first alternates),
ROUNDS of each at that size alone, so that both see the machine in the same minute; each figure
is the least of the rounds' medians (on a shared machine a displaced rank only adds time), the
same rule for both sides.

    bench_comm.py --strata build/strata --reference build/tests/plan/comm_reference \
        [--max_bytes 64M] [--rounds 3] [--out benchmarks/results/DATE-CPU-bench-comm.txt]

Prints (and writes to --out) strata's table for every op, its fit (docs/planning.md), and the
ops the reference also runs side by side: strata's allreduce (the gradients' non-blocking sum,
pairwise since 2026-11-26) against the reference's pairwise sum, allreduce_blocking against
MPI_Allreduce, sendrecv against the ping-pong, with the difference; and the reference's
MPI_Iallreduce (strata's buckets' call before) over the pairwise sum and over MPI_Allreduce.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
MPIRUN = ["mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none"]
OPS = ["allreduce", "reduce_scatter", "all_gather", "sendrecv", "allreduce_blocking"]
REFERENCE_OF = {"allreduce": "pairwise", "allreduce_blocking": "allreduce", "sendrecv": "sendrecv"}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def run(cmd):
    p = subprocess.run(MPIRUN + cmd, env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr[-3000:]}")
    return p


def strata_round(strata, lo, hi, ops, work):
    out = os.path.join(work, "profile.json")
    p = run([strata, "bench", "comm", "--min_bytes", str(lo), "--max_bytes", str(hi), "--ops",
             ",".join(ops), "--rounds", "1", "--out", out, "--quiet"])  # one sweep a launch, as the reference
    with open(out) as f:
        return json.load(f), p.stdout


def reference_round(ref, lo, hi):
    figures = {}
    for line in run([ref, str(lo), str(hi), "20", "5"]).stdout.splitlines():
        op, b, t = line.split()
        figures[(op, int(b))] = float(t)
    return figures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--max_bytes", default="64M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    max_b = int(a.max_bytes[:-1]) * UNITS[a.max_bytes[-1]] if a.max_bytes[-1] in UNITS else int(a.max_bytes)
    work = tempfile.mkdtemp(prefix="bench-comm-")
    t0 = time.time()
    load0 = os.getloadavg()[0]
    p, table = strata_round(a.strata, 8, max_b, OPS, work)
    least, ref = {}, {}
    b = 8
    while b <= max_b:
        s_runs, r_runs = [], []
        for r in range(a.rounds):
            for which in ([0, 1] if r % 2 == 0 else [1, 0]):
                if which == 0:
                    s_runs.append(strata_round(a.strata, b, b, list(REFERENCE_OF), work)[0])
                else:
                    r_runs.append(reference_round(a.reference, b, b))
        for op in REFERENCE_OF:
            least[(op, b)] = min(m["time_s"] for s in s_runs for m in s["measurements"] if m["op"] == op)
        for k in r_runs[0]:
            ref[k] = min(x[k] for x in r_runs)
        b *= 2
    wall = time.time() - t0
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    lines = [f"# benchmarks/bench_comm.py --max_bytes {a.max_bytes} --rounds {a.rounds}",
             f"# {p['date']}, {p['strata']}, lscpu: Model name: {model}, {os.cpu_count()} vCPUs, "
             f"shared with other builds; load average before {load0:.1f}, after "
             f"{os.getloadavg()[0]:.1f}; {wall:.0f} s",
             f"# 2 ranks on 1 node ({p['backend']}, device {p['device']}), {p['iters']} iterations after "
             f"{p['warmup']} per size", "",
             f"mpirun -n 2 strata bench comm --max_bytes {a.max_bytes} --ops {','.join(OPS)}:", table.rstrip()]
    lines += ["", "its fit (time ~ latency_s + bytes x factor / busbw_Bps):"]
    for op, levels in p["fit"].items():
        for level, f in levels.items():
            lines.append(f"  {op:<19} {level}: latency {f['latency_s'] * 1e6:.2f} us, "
                         f"busbw {f['busbw_Bps'] / 1e9:.3f} GB/s")
    lines += ["", f"size by size beside the plain MPI reference, each the least of {a.rounds} "
              "alternating launches' medians (strata op: reference call):",
              f"{'op':<19} {'bytes':>10} {'strata_us':>11} {'reference_us':>13} {'diff':>8}"]
    for op, rop in REFERENCE_OF.items():
        for (o, b), t in sorted(least.items(), key=lambda kv: kv[0][1]):
            if o == op and (rop, b) in ref:
                r = ref[(rop, b)]
                lines.append(f"{op + ':' + rop:<19} {b:>10} {t * 1e6:>11.2f} {r * 1e6:>13.2f} "
                             f"{(t - r) / r * 100:>+7.1f}%")
    lines.append("")
    lines.append("MPI_Iallreduce / MPI_Allreduce (the reference's own calls): " + ", ".join(
        f"{b >> 10} KiB {ref[('iallreduce', b)] / ref[('allreduce', b)]:.2f}x"
        for (o, b) in sorted(ref) if o == "allreduce" and b >= 65536))
    lines.append("MPI_Iallreduce / the pairwise sum (the reference's own calls): " + ", ".join(
        f"{b >> 10} KiB {ref[('iallreduce', b)] / ref[('pairwise', b)]:.2f}x"
        for (o, b) in sorted(ref) if o == "pairwise" and b >= 65536))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
