#!/usr/bin/python3
"""`strata bench comm` checks what it measures and knows its levels (small sizes, a few seconds):

- a wrong result is caught: STRATA_BENCH_COMM_CORRUPT=OP:RANK (the test hook) adds 1 to one input
  element of that rank's checked call; each op then fails with exit 1 and one line naming the
  op, the size, the level and the first bad index, on the rank that found it;
- 4 ranks on 2 simulated nodes (SLURMD_NODENAME, as the Slurm tests tell nodes apart on one
  host) measure both levels: intra (2 ranks of a node) and inter (one rank per node), and the
  profile says 2 nodes of 2 ranks with a fit for each op and level;
- the device communicator's path (--device cpu-staged: separate memory, the GPU path's copies
  and streams on the CPU) measures and checks every op.

    bench_comm_checks.py STRATA WORKDIR
"""
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mpi"))
from common import MPI_ENV, fresh_dir  # noqa: E402

OPS = ["allreduce", "reduce_scatter", "all_gather", "sendrecv"]
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]


def run(cmd, env=None):
    return subprocess.run(cmd, env=dict(MPI_ENV, **(env or {})), capture_output=True, text=True,
                          timeout=120)


def expect_ok(p, what):
    if p.returncode != 0:
        sys.exit(f"FAIL: {what} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")


def corrupt_each_op(strata, work):
    for op, rank in [("allreduce", 1), ("reduce_scatter", 0), ("all_gather", 1), ("sendrecv", 0)]:
        p = run(MPIRUN + ["-n", "2", strata, "bench", "comm", "--max_bytes", "64", "--ops", op,
                          "--iters", "2", "--warmup", "0", "--out", os.path.join(work, "c.json")],
                env={"STRATA_BENCH_COMM_CORRUPT": f"{op}:{rank}"})
        lines = [x for x in p.stderr.splitlines() if x.startswith("strata:")]
        want = re.compile(rf"strata: error: rank \d \(.*\): bench comm: {op} of 8 bytes \(intra, "
                          rf"2 ranks\) gave a wrong result at index \d: \d+ where \d+ was expected$")
        if p.returncode != 1 or len(lines) != 1 or not want.match(lines[0]):
            sys.exit(f"FAIL: corrupting {op} on rank {rank}: exit {p.returncode}, expected 1 and "
                     f"one line like {want.pattern}\n{p.stderr[-3000:]}")
        if os.path.exists(os.path.join(work, "c.json")):
            sys.exit(f"FAIL: corrupting {op}: a profile was written despite the wrong result")
        print(f"ok: a corrupted {op} on rank {rank} is caught: {lines[0]}")


def two_nodes(strata, work):
    out = os.path.join(work, "two-nodes.json")
    args = ["bench", "comm", "--max_bytes", "4K", "--iters", "3", "--warmup", "1", "--out", out]
    p = run(MPIRUN + ["-n", "2", "env", "SLURMD_NODENAME=nodeA", strata] + args +
            [":", "-n", "2", "env", "SLURMD_NODENAME=nodeB", strata] + args)
    expect_ok(p, "4 ranks on 2 simulated nodes")
    with open(out) as f:
        prof = json.load(f)
    assert (prof["ranks"], prof["nodes"], prof["ranks_per_node"]) == (4, 2, 2), prof
    for op in OPS:
        assert set(prof["fit"][op]) == {"intra", "inter"}, prof["fit"]
    levels = {(m["op"], m["level"], m["ranks"]) for m in prof["measurements"]}
    assert levels == {(op, lv, 2) for op in OPS for lv in ("intra", "inter")}, levels
    assert len(prof["measurements"]) == 4 * 2 * 10, len(prof["measurements"])  # 8 B .. 4 KiB
    rows = [x for x in p.stdout.splitlines() if re.match(r"^(allreduce|reduce_scatter|all_gather|sendrecv) ", x)]
    assert len(rows) == 80, p.stdout
    print("ok: 2 simulated nodes: intra and inter measured for every op")


def staged(strata, work):
    out = os.path.join(work, "staged.json")
    p = run(MPIRUN + ["-n", "2", strata, "bench", "comm", "--device", "cpu-staged", "--max_bytes",
                      "64K", "--iters", "3", "--warmup", "1", "--out", out])
    expect_ok(p, "--device cpu-staged")
    with open(out) as f:
        prof = json.load(f)
    assert prof["device"] == "cpu-staged" and prof["backend"] == "mpi", prof
    assert len(prof["measurements"]) == 4 * 14, len(prof["measurements"])  # 8 B .. 64 KiB
    progress = [x for x in p.stderr.splitlines() if x.startswith("bench comm: [")]
    assert len(progress) == 3 * 4 * 14, p.stderr  # a line per size in each of the 3 rounds
    # Each size's figure is the median of its 3 rounds' (progress lines: us to 2 decimals).
    rounds = {}
    for x in progress:
        m = re.match(r"bench comm: \[\d+/168\] round [123]/3: intra (\w+) (\d+) B: ([\d.]+) us", x)
        assert m, x
        rounds.setdefault((m[1], int(m[2])), []).append(float(m[3]))
    for m in prof["measurements"]:
        got = rounds[(m["op"], m["bytes"])]
        assert len(got) == 3 and abs(m["time_s"] * 1e6 - statistics.median(got)) <= 0.006, (m, got)
    print("ok: the device communicator's path (cpu-staged) measures and checks every op, "
          "each size the median of 3 rounds")


def main():
    strata, parent = sys.argv[1:3]
    work = fresh_dir(parent, "bench-comm-checks")
    corrupt_each_op(strata, work)
    two_nodes(strata, work)
    staged(strata, work)
    print("PASS")


if __name__ == "__main__":
    main()
