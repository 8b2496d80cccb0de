#!/usr/bin/env python3
"""The step-time cost of memory checkpoints (issue 33): checkpoint.memory_every = 1 against
off, the MLP, CNN and GPT configs on 2 ranks, in the same run.

  benchmarks/bench_memory_checkpoints.py [--strata build/strata] [--fmnist data/fashion-mnist.h5]
      [--fortunes data/fortunes.h5] [--repeats 3] [--models mlp,cnn,gpt] [--memory_root /dev/shm]
      [--bind core|none] [--out FILE]

The "on" arm starts the two ranks as two simulated nodes (SLURMD_NODENAME n1 and n2, as on
the local Slurm cluster), so each rank's part is also sent to its partner and written there:
the whole cost. The "local" arm (--arms off,local,on) starts both on one node: no partner, the
copy alone, which separates the copy's cost from the exchange's. The "budget" arm is "on" with
checkpoint.memory_budget (--budget, default 0.03): the interval grows from memory_every after
the first 16 saves until a save's measured time fits the budget; the interval it chose is
printed beside the cost. Each repeat runs the arms back
to back, the order rotated each repeat; the figure per arm is the median over repeats of the
training time per step (strata's `done` event: train_time_s / steps, start-up excluded).
strata's own line gives the training thread's stall per memory checkpoint (median and max of
the run's saves) and the time per save off the training thread (copy, exchange). The machine's
CPU and load average are printed with the table. Each rank is bound to a core (--bind core,
mpirun's own default for 2 ranks); --bind none lets the kernel move the ranks between cores,
which on a 2-core machine puts both on one core at times and makes a rank refill its core's
caches after each move.
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
ap.add_argument("--device", default="cpu", help="strata's --device for every run (cpu, cuda)")
ap.add_argument("--arms", default="off,on",
                help="off, local (one node: no partner), on (two nodes), budget (on with --budget)")
ap.add_argument("--budget", type=float, default=0.03, help="checkpoint.memory_budget of the budget arm")
ap.add_argument("--scale", type=int, default=1,
                help="multiplies every model's steps (the budget arm's first 16 saves at memory_every weigh less)")
ap.add_argument("--bind", choices=("core", "none"), default="core",
                help="mpirun's --bind-to: core (its own default for 2 ranks) or none (the kernel "
                     "moves the ranks between cores)")
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


def run(model, arm):
    cfg, data, steps = MODELS[model]
    steps *= a.scale
    memory = arm != "off"
    out = os.path.join(a.work, f"{model}-{arm}")
    shutil.rmtree(out, ignore_errors=True)
    args = [a.strata, "train", "--config", os.path.join(ROOT, "configs", cfg), "--data.path", data,
            "--train.max_steps", str(steps), "--output.dir", out, "--progress", "off",
            "--checkpoint.final", "false", "--threads", "1", "--device", a.device]
    if memory:
        args += ["--checkpoint.memory_every", str(a.every), "--checkpoint.memory_dir",
                 os.path.join(a.memory_root, "strata-bench-memory", "%n")]
    if arm == "budget":
        args += ["--checkpoint.memory_budget", str(a.budget)]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", a.bind,
           "-n", "1", "-x", "SLURMD_NODENAME=n1", *args, ":",
           "-n", "1", "-x", f"SLURMD_NODENAME={'n1' if arm == 'local' else 'n2'}", *args]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        done = [json.loads(l) for l in f if '"done"' in l][-1]
    stall = re.search(r"stall per save: median ([0-9.]+) ms, max ([0-9.]+) ms", p.stdout)
    if memory and not stall:
        sys.exit(f"no stall line in the output of {' '.join(cmd)}:\n{p.stdout[-2000:]}")
    if memory:
        print("  " + next(l for l in p.stdout.splitlines() if "stall per save" in l), flush=True)
    side = re.search(r"per save: copy ([0-9.]+) ms, (?:exchange ([0-9.]+) ms|no partner)", p.stdout)
    interval = re.search(r"memory checkpoints: every (\d+) steps? from step.*", p.stdout)
    if arm == "budget":
        decided = re.search(r"memory checkpoints: (copies|the update goes on).*", p.stdout)
        for m in (decided, interval):
            if m:
                print("  " + m.group(0), flush=True)
        if not interval and not decided:
            print("  (the interval was not set: too few steps)", flush=True)
    per_step = lambda k: 1e3 * done.get(k, 0.0) / done["step"]
    return {"step_s": done["train_time_s"] / done["step"],
            "sums_ms": per_step("allreduce_exposed_s"), "stall_step_ms": per_step("lost_checkpoint_stall_s"),
            "every": int(interval.group(1)) if interval else (a.every if memory else None),
            "copy_ms": float(side.group(1)) if side else None,
            "exchange_ms": float(side.group(2)) if side and side.group(2) else None,
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
             f"# --device {a.device}; 2 ranks, 1 thread each, --bind-to {a.bind}; memory_every = {a.every}; arms {a.arms}; budget {a.budget} (local: one node, "
             f"no partner; on: two simulated nodes); median of {a.repeats} repeats, order rotated"]
    print("\n".join(lines), flush=True)
    arms = a.arms.split(",")
    if "off" not in arms:
        sys.exit("--arms must include off (the baseline)")
    med = lambda xs: statistics.median(xs) if xs else None
    rows = []
    for model in a.models.split(","):
        res = {arm: [] for arm in arms}
        for i in range(a.repeats):
            for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
                r = run(model, arm)
                res[arm].append(r)
                print(f"{model} {arm} repeat {i}: {1e3 * r['step_s']:.2f} ms/step (gradient sums "
                      f"{r['sums_ms']:.3f} ms of it, checkpoint stalls {r['stall_step_ms']:.3f})"
                      + (f", stall per save median {r['stall_ms']:.2f} ms (max {r['stall_max_ms']:.2f}),"
                         f" copy {r['copy_ms']} ms, exchange {r['exchange_ms']} ms, every {r['every']}"
                         if arm != "off" else ""), flush=True)
        off = med([x["step_s"] for x in res["off"]])
        for arm in arms:
            if arm == "off":
                continue
            rs = res[arm]
            rows.append((model, arm, MODELS[model][2] * a.scale, off, med([x["step_s"] for x in rs]),
                         med([x["stall_ms"] for x in rs]),
                         med([x["copy_ms"] for x in rs if x["copy_ms"] is not None]),
                         med([x["exchange_ms"] for x in rs if x["exchange_ms"] is not None]),
                         rs[0]["per_node"], med([x["every"] for x in rs])))
    lines.append(f"{'model':<5} {'arm':<6} {'steps':>6} {'off ms/step':>12} {'on ms/step':>11} {'cost':>7} "
                 f"{'every':>6} {'stall/save ms':>14} {'copy ms':>8} {'exchange ms':>12} {'memory per node':>16}")
    fmt_ms = lambda v: f"{v:.2f}" if v is not None else "-"
    for model, arm, steps, off, on, stall, copy, exch, per_node, every in rows:
        lines.append(f"{model:<5} {arm:<6} {steps:>6} {1e3 * off:>12.2f} {1e3 * on:>11.2f} "
                     f"{100 * (on / off - 1):>+6.1f}% {every if every is not None else '-':>6} "
                     f"{stall:>14.2f} {fmt_ms(copy):>8} "
                     f"{fmt_ms(exch):>12} {per_node or '?':>16}")
    lines.append(f"# load average after: {os.getloadavg()[0]:.2f}")
    print("\n".join(lines[-len(rows) - 2:]))
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"saved {a.out}")


if __name__ == "__main__":
    main()
