#!/usr/bin/python3
"""`strata plan` and `strata train --parallel.auto` on 2 ranks (a tiny MLP, a few seconds):

- `strata plan --json` lists grids whose keys `strata train --check_grid 2` accepts, the ones
  that fit first, each with its memory breakdown summing to its peak;
- with a memory limit between two grids' peaks, `--parallel.auto true` takes the first grid of
  plan's list that fits (the same decision as `strata plan` with the same limit), says so in a
  `plan:` line, trains, and gives the loss the same grid given by hand gives, bitwise;
- a limit no grid fits: one line `strata: error: ... no grid of 2 ranks fits ...: the smallest
  needs ...` naming the smallest grid, exit 2, nothing trained.

    plan_auto.py STRATA WORKDIR
"""
import json
import os
import re
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mpi"))
from common import MPI_ENV, fresh_dir  # noqa: E402

MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2"]


def run(cmd):
    return subprocess.run(cmd, env=MPI_ENV, capture_output=True, text=True, timeout=120)


def expect_ok(p, what):
    if p.returncode != 0:
        sys.exit(f"FAIL: {what} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")


def grid_flags(keys):
    out = []
    for k, v in keys.items():
        out += [f"--{k}", str(v)]
    return out


def losses(metrics):
    with open(metrics) as f:
        return [json.loads(line)["loss"] for line in f if '"loss"' in line and '"step"' in line]


def main():
    strata, work = sys.argv[1], fresh_dir(sys.argv[2], "plan-auto")
    data = os.path.join(work, "tiny.h5")
    rng = np.random.default_rng(5)
    with h5py.File(data, "w") as f:
        f["train/images"] = rng.integers(0, 255, (256, 8, 8)).astype(np.uint8)
        f["train/labels"] = rng.integers(0, 4, 256).astype(np.uint8)
        f.attrs["classes"] = 4
    model = ["--data.path", data, "--model.hidden", "64", "32", "--train.batch_size", "16",
             "--train.optimizer", "adamw", "--train.lr", "0.001", "--train.log_every", "1"]

    # Every grid of 2 ranks, unlimited memory.
    p = run([strata, "plan", *model, "--nodes", "1", "--ranks_per_node", "2", "--json",
             "--memory_per_rank", "1e12"])
    expect_ok(p, "strata plan --json")
    plan = json.loads(p.stdout)
    grids = plan["grids"]
    if len(grids) < 10 or not all(g["fits"] for g in grids):
        sys.exit(f"FAIL: expected 10+ grids, all fitting 1e12 bytes: {len(grids)}")
    for g in grids:
        m = g["memory"]
        parts = sum(m[k] for k in ("parameters", "gradients", "optimizer", "activations", "workspace",
                                   "communication", "whole_model", "memory_checkpoints"))
        if abs(parts - m["peak_bytes"]) > 2:
            sys.exit(f"FAIL: memory parts {parts} do not sum to the peak {m['peak_bytes']}: {g}")
    for g in grids[:: max(1, len(grids) // 6)]:  # a spread of them: train's own check accepts each
        expect_ok(run([strata, "train", *model, *grid_flags(g["keys"]), "--check_grid", "2"]),
                  f"check_grid of {g['keys']}")
    print(f"plan: {len(grids)} grids of 2 ranks, {plan['refused']} refused; train --check_grid accepts a spread")

    # A limit between the plain grid's peak (D 2, nothing else) and the smallest one.
    plain = next(g for g in grids if g["data_parallel"] == 2 and g["keys"]["parallel.zero"] == 0 and
                 g["keys"]["parallel.microbatches"] == 1)
    smallest = min(g["memory"]["peak_bytes"] for g in grids)
    if not smallest < plain["memory"]["peak_bytes"]:
        sys.exit(f"FAIL: no grid below the plain one's {plain['memory']['peak_bytes']} bytes")
    limit = (smallest + plain["memory"]["peak_bytes"]) / 2
    p = run([strata, "plan", *model, "--nodes", "1", "--ranks_per_node", "2", "--json",
             "--memory_per_rank", f"{limit:.0f}"])
    expect_ok(p, "strata plan --json with a limit")
    limited = json.loads(p.stdout)["grids"]
    first = limited[0]
    if not first["fits"] or plain["keys"] == first["keys"]:
        sys.exit(f"FAIL: with {limit:.0f} bytes the first grid should fit and not be the plain one: {first}")

    out_auto, out_hand = os.path.join(work, "auto"), os.path.join(work, "hand")
    common = ["--train.max_steps", "6", "--checkpoint.final", "false", "--quiet"]
    p = run(MPIRUN + [strata, "train", *model, *common, "--output.dir", out_auto, "--parallel.auto", "true",
                      "--parallel.memory_per_rank", f"{limit:.0f}"])
    expect_ok(p, "train --parallel.auto")
    line = next((l for l in p.stdout.splitlines() if l.startswith("plan: parallel.auto took")), None)
    if line is None:
        sys.exit(f"FAIL: no `plan: parallel.auto took` line:\n{p.stdout}")
    print(line)
    p = run(MPIRUN + [strata, "train", *model, *common, "--output.dir", out_hand, *grid_flags(first["keys"])])
    expect_ok(p, "train with plan's first grid by hand")
    a, h = losses(os.path.join(out_auto, "metrics.jsonl")), losses(os.path.join(out_hand, "metrics.jsonl"))
    if not a or a != h:
        sys.exit(f"FAIL: auto's losses {a} differ from the hand-given grid's {h}")
    print(f"auto = hand ({first['keys']}): losses {a}")

    # No grid fits.
    p = run(MPIRUN + [strata, "train", *model, *common, "--output.dir", os.path.join(work, "nofit"),
                      "--parallel.auto", "true", "--parallel.memory_per_rank", "1e6"])
    errors = [l for l in p.stderr.splitlines() if l.startswith("strata: error:")]
    if p.returncode != 2 or len(errors) != 1 or not re.search(
            r"no grid of 2 ranks fits 1 MB per rank \(parallel\.memory_per_rank = 1e\+06\): the smallest "
            r"needs \d+ MB \(D \d x P \d x T 1, ZeRO \d.*\); give more ranks or memory", errors[0]):
        sys.exit(f"FAIL: no-fit: exit {p.returncode}, errors {errors}\n{p.stderr[-2000:]}")
    if os.path.exists(os.path.join(work, "nofit", "metrics.jsonl")):
        sys.exit("FAIL: the no-fit run trained")
    print(errors[0])
    print("PASS")


if __name__ == "__main__":
    main()
