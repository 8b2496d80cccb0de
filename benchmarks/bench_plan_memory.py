#!/usr/bin/python3
"""`strata plan`'s memory per rank against the peak resident set training measures, on the
grids 2 ranks run here: a GPT (dim 384, 6 blocks, GPT-2's vocabulary, context 128, batch 4
sequences, AdamW) under data parallelism with ZeRO 0/1/2, pipelines of 2 stages under each
schedule, tensor parallelism, recompute. For each grid: plan's peak (its largest rank) and the
largest rank's peak RSS from the run's `done` line (`peak_rss_mb`, getrusage), and the error.

    benchmarks/bench_plan_memory.py [--strata build/strata] [--threads 1]
        [--out benchmarks/results/DATE-plan-memory.txt]

Exit 1 when an estimate is off by more than 10 % (issue 32)."""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
GRIDS = [
    ("D 2", {}),
    ("D 2, ZeRO 1", {"parallel.zero": 1}),
    ("D 2, ZeRO 2", {"parallel.zero": 2}),
    ("D 2, recompute", {"train.recompute": "block"}),
    ("T 2", {"parallel.tensor": 2}),
    ("P 2, 1f1b, M 4", {"parallel.pipeline_stages": 2, "parallel.microbatches": 4}),
    ("P 2, gpipe, M 4", {"parallel.pipeline_stages": 2, "parallel.microbatches": 4, "parallel.schedule": "gpipe"}),
    ("P 2, zb-h1, M 4", {"parallel.pipeline_stages": 2, "parallel.microbatches": 4, "parallel.schedule": "zb-h1"}),
    ("P 2, interleaved v 2, M 4", {"parallel.pipeline_stages": 2, "parallel.microbatches": 4,
                                   "parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
]


def cpu_name():
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip() + f", {os.cpu_count()} CPUs"
    return platform.processor() or "unknown CPU"


def keys_of(grid):
    k = {"parallel.pipeline_stages": 1, "parallel.tensor": 1, "parallel.zero": 0, "parallel.schedule": "1f1b",
         "parallel.virtual_stages": 1, "parallel.microbatches": 1, "train.recompute": "none"}
    k.update(grid)
    return k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--threads", default="1")
    ap.add_argument("--out", default=os.path.join(HERE, "results", f"{datetime.date.today()}-plan-memory.txt"))
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="strata-plan-memory-")
    data = os.path.join(work, "tokens.h5")
    with h5py.File(data, "w") as f:
        f["train/tokens"] = np.random.default_rng(32).integers(0, 50257, 40000).astype(np.uint16)
        f.attrs["kind"] = "tokens"
        f.attrs["vocab"] = np.int64(50257)
    model = ["--data.path", data, "--model.type", "gpt", "--model.layers", "6", "--model.heads", "6",
             "--model.dim", "384", "--model.context", "128", "--train.batch_size", "4",
             "--train.optimizer", "adamw", "--threads", a.threads]
    p = subprocess.run([a.strata, "plan", *model, "--nodes", "1", "--ranks_per_node", "2", "--json",
                        "--memory_per_rank", "1e12"], capture_output=True, text=True, env=ENV)
    if p.returncode != 0:
        sys.exit(p.stderr)
    grids = json.loads(p.stdout)["grids"]
    lines = [f"strata plan's memory per rank against the measured peak RSS, 2 ranks, {cpu_name()}, "
             f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC",
             f"{'grid':<28} {'plan MB':>9} {'RSS MB':>9} {'error':>7}"]
    worst = 0.0
    for name, grid in GRIDS:
        keys = keys_of(grid)
        g = next((g for g in grids if all(g["keys"][k] == v for k, v in keys.items())), None)
        if g is None:
            sys.exit(f"plan offers no grid {keys}")
        out = os.path.join(work, name.replace(" ", "_").replace(",", ""))
        flags = [x for k, v in keys.items() for x in (f"--{k}", str(v))]
        r = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-n", "2", a.strata, "train", *model,
                            *flags, "--device", "cpu",  # host memory, also on a GPU node
                            "--train.max_steps", "2", "--checkpoint.final", "false", "--quiet",
                            "--output.dir", out], capture_output=True, text=True, env=ENV)
        if r.returncode != 0:
            sys.exit(f"{name}: train failed\n{r.stderr[-2000:]}")
        done = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"done"' in l][-1]
        rss = max(done["peak_rss_mb"]) * 1048576
        est = g["memory"]["peak_bytes"]
        err = est / rss - 1
        worst = max(worst, abs(err))
        lines.append(f"{name:<28} {est / 1e6:>9.1f} {rss / 1e6:>9.1f} {100 * err:>+6.1f}%")
        print(lines[-1], flush=True)
    lines.append(f"worst error {100 * worst:.1f} %")
    print("\n".join(lines[:2] + lines[-1:]))
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    sys.exit(1 if worst > 0.10 else 0)


if __name__ == "__main__":
    main()
