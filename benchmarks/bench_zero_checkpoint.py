#!/usr/bin/python3
"""ZeRO checkpoints: every rank writing its shard (checkpoint.writer = parallel, parallel HDF5)
against the shards gathered on rank 0 and written there (checkpoint.writer = rank0, synchronous
and in the background), beside `dd conv=fsync` of the same size on the same disk, in the same
run.

The model is an MLP 784-4096-4096-10 (20.0 M parameters) with AdamW: a checkpoint of the
parameters and both moments is 240 MB. For each D in --replicas and each repeat (interleaved),
each writer trains 9 steps with parallel.zero = 2 and a checkpoint every 3 (3 checkpoints), and
dd writes a file of the checkpoint's size; the same with parallel.zero = 0 (rank 0 writes what
every rank holds, synchronously and in the background). Reported per writer: the median over every
checkpoint of the write time (the file written, fsynced and renamed), the training thread's
stall (for rank0 also the gather of the shards onto rank 0, and the snapshot when in the
background) and MB/s (bytes / stall for the synchronous writers), and dd's median MB/s.

Usage: bench_zero_checkpoint.py --strata build/strata --data build/test-data/fashion-mnist.h5
                                [--replicas 2 4] [--repeats 3] [--dir /var/tmp/bench-zero-ckpt]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mpi"))
from common import MPI_ENV as ENV  # noqa: E402  (mpirun as root, oversubscribed)
WRITERS = {"parallel": ["--checkpoint.writer", "parallel"],
           "rank0 sync": ["--checkpoint.writer", "rank0", "--checkpoint.async", "false"],
           "rank0 background": ["--checkpoint.writer", "rank0", "--checkpoint.async", "true"],
           # Without ZeRO (nothing to gather: every rank holds the whole state).
           "zero 0, rank0 sync": ["--parallel.zero", "0", "--checkpoint.async", "false"],
           "zero 0, background": ["--parallel.zero", "0", "--checkpoint.async", "true"]}


def train(strata, data, d, extra, out):
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mpirun", "-n", str(d), "--bind-to", "none", strata, "train", "--quiet",
           "--data.path", data, "--model.type", "custom", "--model.layers", "flatten",
           "linear 4096", "relu", "linear 4096", "relu", "linear 10", "--train.batch_size", "64",
           "--train.optimizer", "adamw", "--train.lr", "0.0003", "--train.max_steps", "9",
           "--checkpoint.every_steps", "3", "--checkpoint.final", "false", "--threads", "1",
           "--output.dir", out] + (extra if "--parallel.zero" in extra else ["--parallel.zero", "2"] + extra)
    subprocess.run(cmd, env=ENV, check=True, capture_output=True, text=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [m for m in map(json.loads, f) if m.get("event") == "checkpoint"]


def dd(dirname, mb):
    p = subprocess.run(["dd", "if=/dev/zero", f"of={dirname}/dd.bin", "bs=1M", f"count={mb}",
                        "conv=fsync"], capture_output=True, text=True, check=True)
    os.remove(f"{dirname}/dd.bin")
    m = re.search(r"([\d.]+) s, ([\d.]+) ([MG])B/s", p.stderr)
    return float(m.group(2)) * (1000 if m.group(3) == "G" else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/var/tmp/bench-zero-ckpt")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    with open("/proc/cpuinfo") as f:
        cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    df = subprocess.run(["df", "-T", a.dir], capture_output=True, text=True).stdout.splitlines()[-1]
    print(f"CPU: {cpu}, {os.cpu_count()} cores; directory {a.dir} ({df.split()[1]}); "
          f"median over 3 checkpoints x {a.repeats} repeats")
    for d in a.replicas:
        events = {w: [] for w in WRITERS}
        dds = []
        for rep in range(a.repeats):
            for w, extra in WRITERS.items():
                events[w] += train(a.strata, a.data, d, extra, os.path.join(a.dir, f"run-{d}"))
            mb = events["parallel"][0]["bytes"] / 1e6
            dds.append(dd(a.dir, int(mb / 1.048576) + 1))
        mb = events["parallel"][0]["bytes"] / 1e6
        print(f"\nD = {d} ranks, checkpoint {mb:.1f} MB; dd conv=fsync {statistics.median(dds):.1f} MB/s")
        print(f"{'writer':>18} {'write s':>8} {'stall s':>8} {'MB/s (bytes/stall)':>19}")
        for w, ev in events.items():
            write = statistics.median(e["write_s"] for e in ev)
            stall = statistics.median(e["stall_s"] for e in ev)
            rate = f"{mb / stall:>19.1f}" if "background" not in w else f"{'(background)':>19}"
            print(f"{w:>18} {write:>8.3f} {stall:>8.3f} {rate}")


if __name__ == "__main__":
    main()
