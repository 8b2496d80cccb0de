"""Checkpoints across pipeline grids. A checkpoint holds every tensor under its global name
whatever the number of pipeline stages P that wrote it, so:
 (a) a checkpoint written at step 10 of 20 by P=2 (1f1b, 4 micro-batches, 2 ranks) resumes on
     P=1 (1 rank), P=4 with 8 micro-batches (4 ranks) and P=2 x D=2 with 2 (4 ranks): the losses of steps 11-20 follow the uninterrupted P=2
     run within 1e-5 relative (only the grouping of the gradient sums differs);
 (b) resumed on P=2 again it ends bitwise identical to the uninterrupted run (parameters and
     losses);
 (c) a P=1 checkpoint resumes on P=2 and follows the uninterrupted P=1 run within 1e-5.
Also: the checkpoint holds the same tensors (parameters and AdamW's two moments, global names
and shapes) whichever P wrote it, and its grid attribute is [ranks, data_parallel, stages, tensor].
Usage: pipeline_resume.py STRATA DATA WORKDIR"""
import os
import sys

import h5py

from ckpt_common import all_tensors, assert_bitwise, fail, fresh, metrics, run, train_losses

strata, data, work = sys.argv[1], sys.argv[2], fresh(os.path.join(sys.argv[3], "pipeline-resume"))
STOP, STEPS, RTOL = 10, 20, 1e-5
CKPT = f"ckpt-{STOP:09d}.h5"
# 6 layers in the model summary (flatten, fc1+relu, dropout1, fc2+relu, dropout2, fc3): room
# for 4 stages. AdamW: the checkpoint carries two moment tensors per parameter and a step count.
common = ["--data.path", data, "--model.hidden", "128", "64", "--model.dropout", "0.1",
          "--train.batch_size", "64", "--train.max_steps", str(STEPS), "--train.seed", "11",
          "--train.optimizer", "adamw", "--train.lr", "0.002", "--train.log_every", "1",
          "--checkpoint.every_steps", str(STOP), "--checkpoint.async", "false",
          "--checkpoint.keep_last", "5", "--progress", "off"]


def grid(P, M=4):
    """Flags for P pipeline stages (P=1: none, strata's defaults)."""
    if P == 1:
        return []
    return ["--parallel.pipeline_stages", str(P), "--parallel.microbatches", str(M),
            "--parallel.schedule", "1f1b"]


def uninterrupted(tag, ranks, P):
    d = os.path.join(work, f"ref-{tag}")
    run(strata, ranks, common + grid(P) + ["--output.dir", d])
    ck = os.path.join(d, "checkpoints", CKPT)
    if not os.path.exists(ck):
        fail(f"{tag}: no {CKPT} in {os.path.dirname(ck)}: {os.listdir(os.path.dirname(ck))}")
    return d, ck


def resume(tag, ranks, P, ckpt, M=4):
    d = fresh(os.path.join(work, tag))
    out, _ = run(strata, ranks, common + grid(P, M) + ["--output.dir", d, "--resume", ckpt])
    if f"at step {STOP}" not in out:
        fail(f"{tag}: did not resume at step {STOP}:\n{out[-1500:]}")
    ev = [m for m in metrics(os.path.join(d, "metrics.jsonl")) if m.get("event") == "resumed"]
    if [m.get("step") for m in ev] != [STOP]:
        fail(f"{tag}: resumed events {ev}, expected one at step {STOP}")
    return d


def compare_losses(what, ref_dir, got_dir, rtol):
    a = train_losses(os.path.join(ref_dir, "metrics.jsonl"))
    b = train_losses(os.path.join(got_dir, "metrics.jsonl"))
    steps = sorted(b)
    if steps != list(range(STOP + 1, STEPS + 1)):
        fail(f"{what}: resumed run logged steps {steps}, expected {STOP + 1}..{STEPS}")
    if sorted(a) != list(range(1, STEPS + 1)):
        fail(f"{what}: uninterrupted run logged steps {sorted(a)}, expected 1..{STEPS}")
    rel = max(abs(b[s] - a[s]) / abs(a[s]) for s in steps)
    print(f"{what}: max relative loss difference over steps {STOP + 1}-{STEPS}: {rel:.3e} (bound {rtol:g})")
    if rel > rtol:
        fail(f"{what}: loss curve differs by {rel:.3e} > {rtol:g}")
    return rel


def layout(path):
    """(name, shape) of every tensor in a checkpoint, and its grid attribute."""
    with h5py.File(path, "r") as f:
        g = [int(v) for v in f.attrs["grid"]] if "grid" in f.attrs else None
    return {k: v.shape for k, v in all_tensors(path).items()}, g


worst = 0.0
# (a) and (b): the P=2 checkpoint.
ref2, ck2 = uninterrupted("P2", 2, 2)
# The [parallel] keys may change on resume, micro-batches included (the written run used M=4).
for tag, ranks, P, M, label in (("P2-to-P1", 1, 1, 1, "P=1 (1 rank)"),
                                ("P2-to-P4", 4, 4, 8, "P=4, M=8 (4 ranks)"),
                                ("P2-to-P2xD2", 4, 2, 2, "P=2 x D=2, M=2 (4 ranks)")):
    d = resume(tag, ranks, P, ck2, M)
    worst = max(worst, compare_losses(f"(a) P=2 -> {label}", ref2, d, RTOL))
d = resume("P2-to-P2", 2, 2, ck2)
compare_losses("(b) P=2 -> P=2 (2 ranks)", ref2, d, 0.0)  # bound 0: identical losses
assert_bitwise(os.path.join(ref2, "model.h5"), os.path.join(d, "model.h5"),
               "(b) P=2 -> P=2 resumed vs uninterrupted, final parameters")

# (c): the P=1 checkpoint on P=2.
ref1, ck1 = uninterrupted("P1", 1, 1)
d = resume("P1-to-P2", 2, 2, ck1)
worst = max(worst, compare_losses("(c) P=1 -> P=2 (2 ranks)", ref1, d, RTOL))

# The file is the same whichever P wrote it: same tensors, global names and shapes.
t1, g1 = layout(ck1)
t2, g2 = layout(ck2)
print(f"checkpoint tensors: P=1 {len(t1)}, P=2 {len(t2)}; grid attribute P=1 {g1}, P=2 {g2}")
if t1 != t2:
    fail(f"P=1 and P=2 checkpoints hold different tensors: only P=1 {sorted(t1.keys() - t2.keys())}, "
         f"only P=2 {sorted(t2.keys() - t1.keys())}, shapes differ "
         f"{[k for k in t1.keys() & t2.keys() if t1[k] != t2[k]]}")
if not any(k.startswith("optimizer/exp_avg_sq/") for k in t2):
    fail(f"P=2 checkpoint has no AdamW state: {sorted(t2)}")
if g1 != [1, 1, 1, 1] or g2 != [2, 1, 2, 1]:
    fail(f"grid attributes {g1} (P=1, 1 rank) and {g2} (P=2, 2 ranks); expected [1, 1, 1, 1] and [2, 1, 2, 1]")
print(f"PASS (worst relative loss difference across grids {worst:.3e})")
