#!/usr/bin/python3
"""Pipeline bubble: the measured share of a step each stage spends waiting for other stages,
against each schedule's theory, for gpipe, 1f1b and the zero-bubble zb-h1 and zb-h2; and each
schedule's training speed beside 1f1b's on the deep MLP and on a GPT.

  benchmarks/bench_pipeline_bubble.py STRATA DATA.h5 [--text TEXT.h5] [--repeats 5]
                                      [--steps 60] [--stages 2 4] [--microbatches 1 2 4 8 16]
                                      [--schedules gpipe 1f1b zb-h1 zb-h2 interleaved]
                                      [--speed-steps 30]

Part 1 (bubble). For each P (ranks = P, D = 1, --threads 1), M and schedule it trains a model
whose stages cost the same in forward AND in backward (GPipe runs all forwards, then all
backwards, so a stage that is cheaper in one phase idles in it even if its total matches):
a 7x7 max-pool shrinks the image to 4x4, a Linear(16 -> 512) (1/32 of the others) feeds 8
Linear(512 -> 512)+ReLU layers, and a Linear(512 -> 10) gives the logits. The 8 equal layers
are split evenly (--parallel.stage_layers 7 5 and 5 2 2 3 over the model summary's maxpool1,
flatten1, fc1..fc10): the cheap first and last layers sit on the first and last stage, and
every stage computes its input gradient except the first stage's tiny fc1. (An MLP on the raw
784 pixels has a first layer of another shape, and the first stage skips its input gradient:
its stage is then ~12% costlier in forward and cheaper in backward, which adds idle time to
GPipe that is not the schedule's bubble.) The global batch is fixed at 256, so a micro-batch
is 256/M samples. It reads stage_idle_share from the done event of metrics.jsonl (per stage:
receive/send waits and the per-step agreement allreduce over the step's wall time; the median
over all steps but the first; mean over replicas) and bubble_theory (the schedule's mean idle
share with F, B and W costing the same: (P-1)/(M+P-1) for gpipe and 1f1b, (P-1)/(3M+P-1) for
zb-h1 once M >= P, (P-1)/(vM+P-1) for interleaved; src/parallel/pipeline_schedule.cpp), and prints,
per configuration, the median over
repeats of each stage's idle share, their mean, the theory and the difference in percentage
points. Interleaved runs 2 chunks per stage, the equal layers split evenly over the 2P chunks
(--parallel.stage_layers 5 2 2 3 at P = 2, 4 1 1 1 1 1 1 2 at P = 4), at M a multiple of P. Verdicts per P: gpipe and 1f1b within 5 points of theory at M >= 8; zb-h1's measured
bubble at M = 8 at most half of 1f1b's.

Part 2 (speed, P = 2, M = 8, unless --speed-steps 0; interleaved with 2 chunks per stage,
balanced by the default partition): samples/s of every schedule on the deep
MLP (configs/fmnist_deep_mlp_pipeline.toml's model: 8 x 1024 hidden, batch 256) and, with
--text, on a GPT (4 blocks of dim 128, 4 heads, context 64, batch 32), each beside 1f1b's in
the same repeat: the median of the per-repeat ratios.

The configurations alternate within each repeat, so a drift in the machine's speed hits all
of them. Training runs on a train-only copy of the first 8192 samples of DATA (the test-set
evaluation at the end of a run would cost more than the training; the loop's timing is the
same). With fewer cores than P ranks the ranks share cores (mpirun --oversubscribe): a stage
then also waits for a core, which the idle share counts, so such figures are not the bubble.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import h5py

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("strata")
ap.add_argument("data")
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--steps", type=int, default=60)
ap.add_argument("--stages", type=int, nargs="+", default=[2, 4])
ap.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved"])
ap.add_argument("--text", help="token file (strata prepare text) for the GPT speed figures")
ap.add_argument("--speed-steps", type=int, default=30, help="steps per speed run (0: no speed part)")
ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, metrics)")
a = ap.parse_args()

BATCH = 256
WIDTH = 512
LAYERS = ["maxpool 7", "flatten", f"linear {WIDTH}", "relu"]
for _ in range(8):
    LAYERS += [f"linear {WIDTH}", "relu"]
LAYERS += ["linear 10"]
TOL_POINTS = 5.0
# The model summary's layers: maxpool1, flatten1, fc1 (16 -> 512), fc2..fc9 (512 -> 512, + ReLU),
# fc10 (512 -> 10). Stages of equal cost, given explicitly so the figures measure the schedule,
# not the balancer; other P use strata's cost-balanced default.
STAGE_LAYERS = {2: "7 5", 4: "5 2 2 3"}
# Interleaved, 2 chunks per stage: P*2 chunks of equal cost (per chunk, in layer order).
V = 2
CHUNK_LAYERS = {2: "5 2 2 3", 4: "4 1 1 1 1 1 1 2"}
env = dict(os.environ)
if os.geteuid() == 0:
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

work = tempfile.mkdtemp(prefix="strata-bench-bubble.")
# A private copy of the binary (a rebuild during the benchmark must not mix two versions) and a
# train-only copy of the data (no test evaluation at the end of each run).
strata = os.path.join(work, "strata")
shutil.copy(a.strata, strata)
data = os.path.join(work, "train-only.h5")
with h5py.File(a.data, "r") as src, h5py.File(data, "w") as dst:
    n = min(8192, src["train/images"].shape[0])
    dst["train/images"] = src["train/images"][:n]
    dst["train/labels"] = src["train/labels"][:n]
    if "classes" in src.attrs:
        dst.attrs["classes"] = src.attrs["classes"]

ncpu = os.cpu_count() or 1


def run(P, M, schedule, tag, model=None, steps=None):
    """Trains the bubble model (or `model`: (args, data) of another), returns the done event's
    idle shares, samples/s and the schedule's theory."""
    out = os.path.join(work, tag)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cmd = ["mpirun", "-n", str(P), "--bind-to", "none"]
    if ncpu < P:
        cmd.append("--oversubscribe")
    model_args = model or ["--data.path", data, "--model.type", "custom", "--model.layers", *LAYERS,
                           "--train.batch_size", str(BATCH)]
    steps = steps or a.steps
    cmd += [strata, "train", *model_args, "--train.max_steps", str(steps),
            "--train.log_every", str(steps), "--train.seed", "1", "--threads", "1",
            "--parallel.pipeline_stages", str(P), "--parallel.microbatches", str(M),
            "--parallel.schedule", schedule, "--output.dir", out, "--quiet"]
    if schedule == "interleaved":
        cmd += ["--parallel.virtual_stages", str(V)]
    split = CHUNK_LAYERS if schedule == "interleaved" else STAGE_LAYERS
    if P in split and model is None:
        cmd += ["--parallel.stage_layers", *split[P].split()]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        done = [json.loads(l) for l in f if '"done"' in l][-1]
    idle = [float(v) for v in done["stage_idle_share"]]
    if len(idle) != P or done.get("pipeline_stages") != P or done.get("microbatches") != M:
        sys.exit(f"error: {tag}: done event does not describe the grid: {done}")
    return idle, float(done["samples_per_s"]), float(done["bubble_theory"])


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# Interleaved takes a multiple of P micro-batches.
configs = [(P, M, s) for P in a.stages for M in a.microbatches for s in a.schedules
           if s != "interleaved" or M % P == 0]
print(f"== pipeline bubble, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
print(f"machine: {ncpu} CPUs, load average {load()}; strata {a.strata}")
print(f"model: maxpool 7, Linear(16 -> {WIDTH}), 8 x Linear({WIDTH} -> {WIDTH})+ReLU, Linear({WIDTH} -> 10); "
      f"global batch {BATCH}, {a.steps} steps, --threads 1, ranks = P, D = 1; "
      f"median of {a.repeats}, configurations alternating within each repeat")
for P in a.stages:
    if ncpu < P:
        print(f"note: P={P} runs {P} ranks on this machine's {ncpu} CPUs (oversubscribed): stages wait "
              f"for a core as well as for each other, and the idle share counts both")
sys.stdout.flush()

results = {c: [] for c in configs}
sps = {c: [] for c in configs}
theory_of = {}
for r in range(a.repeats):
    order = configs if r % 2 == 0 else configs[::-1]
    for c in order:
        P, M, s = c
        idle, v, theory_of[c] = run(P, M, s, f"P{P}-M{M}-{s}-r{r}")
        results[c].append(idle)
        sps[c].append(v)
        print(f"  repeat {r + 1}/{a.repeats}  P={P} M={M:<2} {s:5s}  idle "
              f"{' '.join(f'{x:.3f}' for x in idle)}  {v:.0f} samples/s", flush=True)

print()
print("idle share per stage: medians over repeats, in %; theory = the schedule's (bubble_theory); diff = mean - theory "
      "in points;\nfastest = mean idle share of the repeat with the most samples/s (the least disturbed "
      "on a shared machine; for information)")
print(f"{'P':>2} {'M':>3} {'schedule':8} {'per stage':28} {'mean':>6} {'theory':>7} {'diff':>6} {'fastest':>8} "
      f"{'samples/s':>10}")
verdict, means = {}, {}
for c in configs:
    P, M, s = c
    med = [statistics.median(run_[i] for run_ in results[c]) for i in range(P)]
    mean = 100 * sum(med) / P
    means[c] = mean
    theory = 100 * theory_of[c]
    diff = mean - theory
    if M >= 8 and s in ("gpipe", "1f1b"):
        verdict.setdefault(P, []).append(abs(diff) <= TOL_POINTS)
    fastest = results[c][max(range(len(sps[c])), key=lambda i: sps[c][i])]
    print(f"{P:>2} {M:>3} {s:8} {' '.join(f'{100 * x:5.1f}' for x in med):28} {mean:6.1f} {theory:7.1f} "
          f"{diff:+6.1f} {100 * sum(fastest) / P:8.1f} {statistics.median(sps[c]):10.0f}")
print()
for P in a.stages:
    if P in verdict:
        res = "PASS" if all(verdict[P]) else "FAIL"
        note = f" ({P} ranks on {ncpu} CPUs: oversubscribed)" if ncpu < P else ""
        print(f"P={P}: gpipe and 1f1b mean idle share within {TOL_POINTS:g} points of theory at M >= 8: {res}{note}")
    if (P, 8, "zb-h1") in means and (P, 8, "1f1b") in means:
        h1, fb = means[(P, 8, "zb-h1")], means[(P, 8, "1f1b")]
        print(f"P={P}: zb-h1's measured bubble at M=8 {h1:.1f}% against 1f1b's {fb:.1f}% = {h1 / fb:.2f} of it "
              f"(at most half: {'PASS' if h1 <= fb / 2 else 'FAIL'}){note}")

# Part 2: speed of each schedule beside 1f1b's, same run, P = 2, M = 8.
SPEED_MODELS = {"deep MLP (8 x 1024, batch 256)": [
    "--data.path", data, "--model.type", "mlp", "--model.hidden", *["1024"] * 8,
    "--train.optimizer", "adamw", "--train.batch_size", "256"]}
if a.text:
    SPEED_MODELS["GPT (4 x 128, 4 heads, context 64, batch 32)"] = [
        "--data.path", a.text, "--model.type", "gpt", "--model.layers", "4", "--model.heads", "4",
        "--model.dim", "128", "--model.context", "64", "--train.optimizer", "adamw",
        "--train.batch_size", "32"]
if a.speed_steps > 0:
    print(f"\nspeed, P = 2, M = 8, {a.speed_steps} steps, --threads 1: samples/s, median of {a.repeats}; "
          f"ratio = median over repeats of schedule / 1f1b in the same repeat")
    for name, margs in SPEED_MODELS.items():
        got = {s: [] for s in a.schedules}
        for r in range(a.repeats):
            for s in (a.schedules if r % 2 == 0 else a.schedules[::-1]):
                got[s].append(run(2, 8, s, f"speed-{len(got[s])}-{s}", model=margs, steps=a.speed_steps)[1])
        for s in a.schedules:
            ratio = statistics.median(x / y for x, y in zip(got[s], got["1f1b"])) if "1f1b" in got else float("nan")
            print(f"  {name:48s} {s:6s} {statistics.median(got[s]):10.1f} samples/s  x{ratio:.3f} of 1f1b", flush=True)
print(f"load average at the end: {load()}")
if a.keep:
    print(f"work directory kept: {work}")
else:
    shutil.rmtree(work, ignore_errors=True)
