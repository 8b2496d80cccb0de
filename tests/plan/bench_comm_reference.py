#!/usr/bin/python3
"""`strata bench comm` on 2 ranks agrees with a plain MPI reference (comm_reference.cpp: a
ping-pong, MPI_Allreduce and MPI_Iallreduce loops and the pairwise sum written on MPI_Isend and
MPI_Irecv, the same sizes, iterations and
median-of-the-slowest rule) within 10 % at every size from 64 KiB to MAX_BYTES (2 MiB in the
test suite: above it this 2-core machine's time slices make most large sizes undecided and the
test costs a minute and a half; `... 16M` runs the larger ones); its JSON profile
keeps the contract (docs/planning.md); every result it checked was right (it exits 1 otherwise).

Each of strata's ops is held against the MPI calls its Comm makes: `allreduce` (the gradients'
buckets: start_allreduce_sum, a pairwise reduce-scatter and all-gather, src/comm/pairwise.h)
against the reference's pairwise, `allreduce_blocking` (Comm::allreduce_sum) against its
MPI_Allreduce, `sendrecv` against its ping-pong. The reference's MPI_Iallreduce (what strata's
buckets used until 2026-11-26: 1.7-2x the pairwise sum's time here) is printed beside them.

The machine is small and shared, and a rank another process displaces only ever adds time:
so each side's figure at a size is the least of ROUNDS launches' medians, strata's and the
reference's launches alternating (which goes first alternates too), the same rule for both; a
size outside 10 % is measured again, strata and the reference interleaved at that size alone,
once, its rounds joining the first ones, before the test fails. The 10 % is never widened. A difference that remains is a
failure where both sides were steady (each one's two best rounds within 10 % of each other: a
systematic difference); where either was not (other work on the 2 cores: two busy-polling
ranks that share a core wait out time slices of milliseconds), the size is undecided, and the
test reports Skipped (exit 77) naming the sizes and their spreads, never Passed.

    bench_comm_reference.py STRATA COMM_REFERENCE WORKDIR [MAX_BYTES, e.g. 2M or 16M]

A timing comparison, so the suite skips it unless STRATA_TIMING_TESTS=1 (`ctest -L timing` on a
quiet machine): on a CI machine running other tests beside it, a 2 MiB allreduce measured 10.5 %
from the reference with both sides' rounds within 8 %, a difference no rule on 2 shared cores
can tell from a real one.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mpi"))
from common import MPI_ENV, fresh_dir  # noqa: E402

LO, HI = 64 << 10, 2 << 20  # HI: MAX_BYTES
ITERS, WARMUP, ROUNDS, RETRY_ROUNDS = "20", "5", 5, 5
OPS = ("allreduce", "allreduce_blocking", "sendrecv")
REFERENCE_OF = {"allreduce": "pairwise", "allreduce_blocking": "allreduce", "sendrecv": "sendrecv"}
TOLERANCE = 0.10
MPIRUN = ["mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none"]


def run(cmd):
    p = subprocess.run(MPIRUN + cmd, env=MPI_ENV, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def strata_run(strata, work, lo, hi):
    """{(op, bytes): seconds} from strata's JSON profile, which must keep the contract."""
    out = os.path.join(work, "profile.json")
    run([strata, "bench", "comm", "--min_bytes", str(lo), "--max_bytes", str(hi), "--ops",
         ",".join(OPS), "--iters", ITERS, "--warmup", WARMUP, "--rounds", "1", "--out", out,
         "--quiet"])  # one sweep a launch, as the reference
    with open(out) as f:
        prof = json.load(f)
    check_contract(prof, lo, hi)
    return {(m["op"], m["bytes"]): m["time_s"] for m in prof["measurements"]}


def check_contract(prof, lo, hi):
    """The fields strata plan reads (docs/planning.md), with the values 2 ranks on 1 node give."""
    assert prof["strata_comm_profile"] == 1 and prof["source"] == "measured", prof
    assert prof["backend"] == "mpi" and prof["ranks"] == 2, prof
    assert prof["nodes"] == 1 and prof["ranks_per_node"] == 2, prof
    for key in ("date", "host", "strata"):
        assert isinstance(prof[key], str) and prof[key], key
    assert set(prof["fit"]) == set(OPS), prof["fit"]
    for op, levels in prof["fit"].items():
        assert set(levels) == {"intra"}, (op, levels)  # one node: no inter level
        assert levels["intra"]["latency_s"] > 0 and levels["intra"]["busbw_Bps"] > 0, levels
    sizes = []
    b = lo
    while b <= hi:
        sizes.append(b)
        b *= 2
    got = sorted((m["op"], m["bytes"]) for m in prof["measurements"])
    assert got == sorted((op, s) for op in OPS for s in sizes), got
    for m in prof["measurements"]:
        assert m["level"] == "intra" and m["ranks"] == 2, m
        assert abs(m["algbw_Bps"] - m["bytes"] / m["time_s"]) <= 1e-5 * m["algbw_Bps"], m
        # 2 ranks: nccl-tests' factor is 2(n-1)/n = 1 for allreduce, 1 for send/receive
        assert abs(m["busbw_Bps"] - m["algbw_Bps"]) <= 1e-5 * m["algbw_Bps"], m


def reference_run(ref, lo, hi):
    p = run([ref, str(lo), str(hi), ITERS, WARMUP])
    out = {}
    for line in p.stdout.split("\n"):
        if line.strip():
            ref_op, b, t = line.split()
            for op, r in REFERENCE_OF.items():
                if r == ref_op:
                    out[(op, int(b))] = float(t)
    return out


def measure(strata, ref, work, lo, hi, rounds):
    """{(op, bytes): (strata's medians, the reference's)} of `rounds` alternating launches."""
    s_runs, r_runs = [], []
    for r in range(rounds):
        if r % 2 == 0:
            s_runs.append(strata_run(strata, work, lo, hi))
            r_runs.append(reference_run(ref, lo, hi))
        else:
            r_runs.append(reference_run(ref, lo, hi))
            s_runs.append(strata_run(strata, work, lo, hi))
    return {k: ([s[k] for s in s_runs], [x[k] for x in r_runs]) for k in r_runs[0]}


def figures_of(s_medians, r_medians):
    """(strata's figure, the reference's, the larger spread): each side's figure is its least
    median; its spread, how far its second-best median is above that."""
    s, r = sorted(s_medians), sorted(r_medians)
    return s[0], r[0], max(s[1] / s[0], r[1] / r[0]) - 1


def main():
    if os.environ.get("STRATA_TIMING_TESTS") != "1":
        print("skipped: a timing comparison; run it on a quiet machine with STRATA_TIMING_TESTS=1 "
              "(ctest -L timing)")
        sys.exit(77)
    strata, ref, parent = sys.argv[1:4]
    global HI
    if len(sys.argv) > 4:
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        arg = sys.argv[4]
        HI = int(arg[:-1]) * units[arg[-1]] if arg[-1] in units else int(arg)
    work = fresh_dir(parent, "bench-comm-reference")
    figures = measure(strata, ref, work, LO, HI, ROUNDS)
    failed, undecided = [], []
    for (op, b), (s_medians, r_medians) in sorted(figures.items()):
        s, r, spread = figures_of(s_medians, r_medians)
        err = (s - r) / r
        verdict = "ok"
        if abs(err) > TOLERANCE:
            s_more, r_more = measure(strata, ref, work, b, b, RETRY_ROUNDS)[(op, b)]  # this size alone
            s, r, spread = figures_of(s_medians + s_more, r_medians + r_more)
            err = (s - r) / r
            verdict = ("ok on retry" if abs(err) <= TOLERANCE else
                       "FAIL" if spread <= TOLERANCE else "undecided: the machine is too noisy")
        print(f"{op:18s} {b:>9d} B  strata {s * 1e6:10.1f} us  reference ({REFERENCE_OF[op]}) "
              f"{r * 1e6:10.1f} us  {err * 100:+6.1f} %  (spread {spread * 100:.0f} %)  {verdict}")
        if verdict == "FAIL":
            failed.append(f"{op} {b} B: {err * 100:+.1f} %")
        elif verdict.startswith("undecided"):
            undecided.append(f"{op} {b} B ({err * 100:+.0f} %, rounds {spread * 100:.0f} % apart)")
    if failed:
        sys.exit("FAIL: strata bench comm differs from the MPI reference by more than 10 %: " +
                 "; ".join(failed))
    if undecided:
        print("SKIP: the machine's own noise exceeds 10 % at " + "; ".join(undecided) +
              ": other work shares the cores")
        sys.exit(77)
    print("PASS")


if __name__ == "__main__":
    main()
