#!/usr/bin/python3
"""Step time of two (or more) strata builds on bench_gpt.py's GPT, alternating, one thread.

  benchmarks/compare_builds.py OLD_STRATA NEW_STRATA [--repeats 4] [--steps 12]

Each repeat runs every build once (the order alternates between repeats) for --steps steps with
a metrics line per step, and takes the median of its step times from the third step on (the
first two allocate and warm up). Prints each build's median over repeats and the per-repeat
times side by side, so that a change worth a few percent can be told from this shared
machine's drift. Checks first that every run's losses start near log(256) and fall.
Needs the token file bench_gpt.py prepares (data/fortunes-bench.h5).
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_times(strata, data, steps, work):
    shutil.rmtree(work, ignore_errors=True)
    cmd = [strata, "train", "--data.path", data, "--model.type", "gpt", "--model.layers", "6",
           "--model.heads", "6", "--model.dim", "384", "--model.context", "256",
           "--model.dropout", "0", "--train.batch_size", "8", "--train.optimizer", "adamw",
           "--train.lr", "1e-3", "--train.weight_decay", "0.1", "--train.lr_schedule", "constant",
           "--train.warmup_steps", "0", "--train.grad_clip", "0", "--train.epochs", "1000",
           "--train.max_steps", str(steps), "--train.log_every", "1", "--threads", "1",
           "--device", "cpu", "--checkpoint.final", "false", "--watchdog.timeout_s", "0",
           "--output.dir", work, "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"compare_builds.py: {strata} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    rows = [json.loads(line) for line in open(os.path.join(work, "metrics.jsonl"))]
    rows = [r for r in rows if "step" in r and "time_s" in r and "loss" in r]
    losses = [r["loss"] for r in rows]
    if len(rows) != steps or abs(losses[0] - math.log(256)) > 0.5 or not losses[-1] < losses[0]:
        sys.exit(f"compare_builds.py: {strata}: unexpected losses {losses}")
    t = [r["time_s"] for r in rows]
    return statistics.median(b - a for a, b in zip(t[1:], t[2:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("strata", nargs="+", help="strata binaries to compare")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fortunes-bench.h5"))
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    if a.steps < 4:
        sys.exit("compare_builds.py: --steps must be at least 4")
    if not os.path.exists(a.data):
        sys.exit(f"compare_builds.py: {a.data} is missing: run benchmarks/bench_gpt.py once first")
    times = {b: [] for b in a.strata}
    with tempfile.TemporaryDirectory() as work:
        for r in range(a.repeats):
            for b in (a.strata if r % 2 == 0 else a.strata[::-1]):
                times[b].append(step_times(b, a.data, a.steps, os.path.join(work, "run")))
    for b, v in times.items():
        print(f"{b}: median step {statistics.median(v) * 1e3:.1f} ms "
              f"(repeats: {' '.join(f'{x * 1e3:.0f}' for x in v)})")


if __name__ == "__main__":
    main()
