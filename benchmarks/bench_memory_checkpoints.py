#!/usr/bin/env python3
"""The step-time cost of memory checkpoints (issue 33): checkpoint.memory_every = 1 against
off, the MLP, CNN and GPT configs on 2 ranks, in the same run.

  benchmarks/bench_memory_checkpoints.py [--strata build/strata] [--fmnist data/fashion-mnist.h5]
      [--fortunes data/fortunes.h5] [--repeats 3] [--models mlp,cnn,gpt] [--memory_root /dev/shm]
      [--out FILE]

The two ranks are started as two simulated nodes (SLURMD_NODENAME n1 and n2, as on the local
Slurm cluster), so each rank's part is also sent to its partner and written there: the whole
cost. Each repeat runs both arms back to back, in alternating order (off-on, then on-off);
the figure per arm is the median over repeats of the training time per step (strata's `done`
event: train_time_s / steps, start-up excluded). strata's own line gives the training
thread's stall per memory checkpoint (median and max of the run's saves). The machine's CPU
and load average are printed with the table.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ap = argparse.ArgumentParser()
ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
ap.add_argument("--fmnist", default=os.path.join(ROOT, "data", "fashion-mnist.h5"))
ap.add_argument("--fortunes", default=os.path.join(ROOT, "data", "fortunes.h5"))
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--every", type=int, default=1, help="checkpoint.memory_every of the 'on' arm")
ap.add_argument("--models", default="mlp,cnn,gpt")
ap.add_argument("--work", default="/var/tmp/strata-bench-memory")
ap.add_argument("--memory_root", default="/dev/shm",
                help="where the simulated nodes' memory directories go (a tmpfs; a small /dev/shm: another)")
ap.add_argument("--out", default="")
a = ap.parse_args()

MODELS = {  # config, data flag value, steps
    "mlp": ("fmnist_mlp.toml", a.fmnist, 1500),
    "cnn": ("fmnist_cnn.toml", a.fmnist, 150),
    "gpt": ("gpt_fortunes.toml", a.fortunes, 120),
}
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def run(model, memory):
    cfg, data, steps = MODELS[model]
    out = os.path.join(a.work, f"{model}-{'on' if memory else 'off'}")
    shutil.rmtree(out, ignore_errors=True)
    args = [a.strata, "train", "--config", os.path.join(ROOT, "configs", cfg), "--data.path", data,
            "--train.max_steps", str(steps), "--output.dir", out, "--progress", "off",
            "--checkpoint.final", "false", "--threads", "1"]
    if memory:
        args += ["--checkpoint.memory_every", str(a.every), "--checkpoint.memory_dir",
                 os.path.join(a.memory_root, "strata-bench-memory", "%n")]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none",
           "-n", "1", "-x", "SLURMD_NODENAME=n1", *args, ":",
           "-n", "1", "-x", "SLURMD_NODENAME=n2", *args]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        done = [json.loads(l) for l in f if '"done"' in l][-1]
    stall = re.search(r"stall per save: median ([0-9.]+) ms, max ([0-9.]+) ms", p.stdout)
    if memory and not stall:
        sys.exit(f"no stall line in the output of {' '.join(cmd)}:\n{p.stdout[-2000:]}")
    return {"step_s": done["train_time_s"] / done["step"],
            "stall_ms": float(stall.group(1)) if stall else None,
            "stall_max_ms": float(stall.group(2)) if stall else None,
            "per_node": (re.search(r"memory checkpoints: every \d+ steps? into \S+: ([0-9.]+ \S+) per node", p.stdout)
                         or [None, None])[1]}


def main():
    os.makedirs(a.work, exist_ok=True)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = re.search(r"Model name:\s*(.*)", cpu)
    lines = [f"# bench_memory_checkpoints.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             f"# CPU: {name.group(1) if name else '?'}, {os.cpu_count()} cores; "
             f"load average before: {os.getloadavg()[0]:.2f}; strata {a.strata}",
             f"# 2 ranks as two simulated nodes, 1 thread each; memory_every = {a.every} against off; "
             f"median of {a.repeats} repeats, arms alternating"]
    print("\n".join(lines), flush=True)
    rows = []
    for model in a.models.split(","):
        res = {False: [], True: []}
        for i in range(a.repeats):
            for memory in ((False, True) if i % 2 == 0 else (True, False)):
                r = run(model, memory)
                res[memory].append(r)
                print(f"{model} memory_every={a.every if memory else 'off'} repeat {i}: "
                      f"{1e3 * r['step_s']:.2f} ms/step"
                      + (f", stall per save median {r['stall_ms']:.2f} ms (max {r['stall_max_ms']:.2f})"
                         if memory else ""), flush=True)
        off = statistics.median(x["step_s"] for x in res[False])
        on = statistics.median(x["step_s"] for x in res[True])
        stall = statistics.median(x["stall_ms"] for x in res[True])
        rows.append((model, MODELS[model][2], off, on, stall, res[True][0]["per_node"]))
    lines.append(f"{'model':<5} {'steps':>6} {'off ms/step':>12} {'on ms/step':>11} {'cost':>7} "
                 f"{'stall/save ms':>14} {'memory per node':>16}")
    for model, steps, off, on, stall, per_node in rows:
        lines.append(f"{model:<5} {steps:>6} {1e3 * off:>12.2f} {1e3 * on:>11.2f} "
                     f"{100 * (on / off - 1):>+6.1f}% {stall:>14.2f} {per_node or '?':>16}")
    lines.append(f"# load average after: {os.getloadavg()[0]:.2f}")
    print("\n".join(lines[-len(rows) - 2:]))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"saved {a.out}")


if __name__ == "__main__":
    main()
