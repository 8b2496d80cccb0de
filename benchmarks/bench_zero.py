#!/usr/bin/python3
"""ZeRO (parallel.zero) against zero = 0 in the same run: step time, exposed communication,
optimizer-state bytes and peak RSS per rank.

For each model (a wide MLP and a GPT, both AdamW) and each D in --replicas, runs zero = 0, 1
and 2 in turn, --repeats times (interleaved, so drift on a shared machine hits each alike),
and prints per setting the median step time (train_time_s / steps, from the `done` event),
its ratio to zero = 0, the exposed data-parallel communication per step (the done event's
allreduce_exposed_s / steps: allreduce, reduce-scatter and all-gather time on rank 0's
training thread), rank 0's optimizer-state bytes and the largest peak RSS of any rank.
Step times mean something only where ranks x threads <= cores (the script says when not).

Usage: bench_zero.py --strata build/strata --mnist build/test-data/fashion-mnist.h5
                     [--replicas 2 4] [--repeats 3] [--steps 30] [--work DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mpi"))
from common import MPI_ENV as ENV, art_text  # noqa: E402  (mpirun as root, oversubscribed)


def models(mnist, text):
    wide = ["--data.path", mnist, "--model.type", "custom", "--model.layers", "flatten",
            "linear 4096", "relu", "linear 4096", "relu", "linear 10", "--train.batch_size", "64"]
    gpt = ["--data.path", text, "--model.type", "gpt", "--model.layers", "4", "--model.heads", "8",
           "--model.dim", "512", "--model.context", "64", "--model.dropout", "0",
           "--train.batch_size", "8"]
    return {"wide MLP (784-4096-4096-10)": wide, "GPT (4 blocks, dim 512, context 64)": gpt}


def run(strata, ranks, args, out):
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mpirun", "-n", str(ranks), "--bind-to", "none", strata, "train", "--quiet",
           "--output.dir", out, "--train.optimizer", "adamw", "--train.lr", "0.0003",
           "--threads", "1", "--checkpoint.final", "false"] + args
    subprocess.run(cmd, env=ENV, check=True, capture_output=True, text=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(x) for x in f if '"done"' in x][-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--mnist", required=True)
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--work", default="/tmp/bench_zero")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    text = art_text(a.strata, a.work)
    cores = os.cpu_count()
    with open("/proc/cpuinfo") as f:
        cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    print(f"CPU: {cpu}, {cores} cores; {a.steps} steps per run, median of {a.repeats}, "
          f"1 math thread per rank")
    for name, args in models(a.mnist, text).items():
        for d in a.replicas:
            note = "" if d <= cores else f" (oversubscribed: {d} ranks on {cores} cores; step times not comparable)"
            print(f"\n{name}, D = {d}{note}")
            res = {z: [] for z in (0, 1, 2)}
            for rep in range(a.repeats):
                for z in (0, 1, 2):
                    ev = run(a.strata, d, args + ["--train.max_steps", str(a.steps),
                                                  "--parallel.zero", str(z)],
                             os.path.join(a.work, f"r-{d}-{z}"))
                    res[z].append(ev)
            base = statistics.median(e["train_time_s"] for e in res[0]) / a.steps
            print(f"{'zero':>4} {'step s':>9} {'vs 0':>6} {'exposed comm s/step':>20} "
                  f"{'opt state MB/rank':>18} {'peak RSS MB (max rank)':>23}")
            for z in (0, 1, 2):
                step = statistics.median(e["train_time_s"] for e in res[z]) / a.steps
                comm = statistics.median(e["allreduce_exposed_s"] for e in res[z]) / a.steps
                state = res[z][0]["optimizer_state_bytes"][0] / 1e6
                rss = statistics.median(max(e["peak_rss_mb"]) for e in res[z])
                print(f"{z:>4} {step:>9.4f} {step / base:>6.3f} {comm:>20.4f} {state:>18.1f} {rss:>23.1f}")


if __name__ == "__main__":
    main()
