#!/usr/bin/python3
"""GPT grid equivalence: data x pipeline x tensor parallelism follow the one-rank run.

A 2-block GPT (dim 32, 4 heads, context 16, dropout 0.1, AdamW with gradient clipping at a
norm the gradients exceed, so the global norm over every part of the model matters) on a
small byte-level corpus, 30 steps of global batch 8, the same seed on every grid:
  - (data, pipeline, tensor) in (1,1,2), (1,2,1), (2,1,2), (1,2,2), and (2,2,2) on 8 ranks:
    the loss sequence follows the one-rank reference within 1e-5 relative (max over steps),
    the validation loss at the end (through the grid) within 1e-5 relative, and model.h5
    (gathered from the stages and tensor parts into whole tensors) has the reference's
    tensors, names and shapes, each within 1e-3 x max|ref| and 1e-2 x max|ref - init|;
  - (1,2,2) with train.recompute = "block" gives the (1,2,2) losses bit for bit;
  - a checkpoint written at step 15 by (1,2,2) holds whole tensors (the reference's shapes),
    and resuming it on (2,1,2) and on one rank continues the reference's losses (steps 16-30)
    within 1e-5 relative: checkpoints do not depend on the grid that wrote them.
(Bad grids, refused with one line naming the key, are tests/cli's.)

Usage: gpt_grid_equivalence.py STRATA WORKDIR
Every figure measured is printed.
"""
import os
import shutil
import sys

import h5py
import numpy as np

from common import art_text, Checks, losses, metrics, parameters, run_strata

strata, work = sys.argv[1:3]
os.makedirs(work, exist_ok=True)
STEPS = 30
# TOLERANCES. Tensor parallelism sums each block's row-parallel products over the parts
# (another grouping of the same fp32 sum), a pipeline sums the token table's two gradients
# after the fact instead of accumulating one into the other, and data parallelism averages
# over replicas: fp32 rounding, ~1e-7 relative per step. Measured over 30 steps: losses
# within 2.3e-8 relative; parameters within 1.6e-4 x max|ref| (printed below). The largest
# parameter differences are in c_attn's bias: its key third has a zero gradient in exact
# arithmetic (adding q.b_k to a whole row of scores leaves the softmax unchanged), so what it
# gets is rounding, which AdamW's division by sqrt(v) turns into updates of the size of any
# other; elements of the value third with near-zero gradients do the same on a smaller scale.
# Bounds: 1e-3 x max|ref| and 1e-2 x max|ref - init| (a wrong shard, a missing allreduce or a
# skipped update is off by O(1) of the update, 100x this).
LOSS_RTOL = 1e-5
PARAM_TOL_REF = 1e-3
PARAM_TOL_UPDATE = 1e-2

data = art_text(strata, work)

SETTINGS = {"model.type": "gpt", "model.layers": "2", "model.heads": "4", "model.dim": "32",
            "model.context": "16", "model.dropout": "0.1", "train.optimizer": "adamw",
            "train.lr": "0.003", "train.grad_clip": "0.5", "train.batch_size": "8",
            "train.seed": "5", "train.log_every": "1"}


def model_args(**changed):
    args = []
    for k, v in dict(SETTINGS, **{k.replace("__", "."): v for k, v in changed.items()}).items():
        args += [f"--{k}", v]
    return args

check = Checks()


def grid_args(d, p, t):
    return ["--parallel.pipeline_stages", str(p), "--parallel.tensor", str(t)]


def train(tag, d, p, t, extra=(), steps=STEPS, fresh=True, lr="0.003"):
    out = os.path.join(work, f"gpt-grid-{tag}")
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    run_strata(strata, d * p * t, ["train", "--data.path", data, "--train.max_steps", str(steps),
                                   "--output.dir", out, "--quiet"] + model_args(train__lr=lr) +
               grid_args(d, p, t) +
               list(extra))
    ms = metrics(os.path.join(out, "metrics.jsonl"))
    done = [m for m in ms if m.get("event") == "done"][-1]
    return out, losses(os.path.join(out, "metrics.jsonl")), done


def rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# The initial parameters: one step at lr 1e-30 changes no weight.
init_out, _, _ = train("init", 1, 1, 1, steps=1, lr="1e-30")
init = parameters(os.path.join(init_out, "model.h5"))
ref_out, ref_loss, ref_done = train("ref", 1, 1, 1)
ref = parameters(os.path.join(ref_out, "model.h5"))
check(len(ref_loss) == STEPS, f"reference logged {len(ref_loss)} losses")
print(f"reference (1 rank): loss {ref_loss[0]:.4f} -> {ref_loss[-1]:.4f} over {STEPS} steps, "
      f"validation loss {ref_done['test_loss']:.6f}; {len(ref)} tensors")
check(ref_loss[-1] < ref_loss[0] - 0.5, "the reference did not train")
update = {k: float(np.max(np.abs(ref[k].astype(np.float64) - init[k]))) for k in ref}
scale = {k: float(np.max(np.abs(ref[k].astype(np.float64)))) for k in ref}

runs = {}
for d, p, t in ((1, 1, 2), (1, 2, 1), (2, 1, 2), (1, 2, 2), (2, 2, 2)):
    tag = f"d{d}p{p}t{t}"
    out, ls, done = train(tag, d, p, t)
    runs[tag] = ls
    params = parameters(os.path.join(out, "model.h5"))
    lr = rel(ls, ref_loss) if len(ls) == STEPS else float("inf")
    vr = abs(done["test_loss"] - ref_done["test_loss"]) / ref_done["test_loss"]
    check(len(ls) == STEPS, f"{tag}: logged {len(ls)} losses")
    check(lr <= LOSS_RTOL, f"{tag}: losses differ from the reference by {lr:.2e} relative")
    check(vr <= LOSS_RTOL, f"{tag}: validation loss {done['test_loss']} vs {ref_done['test_loss']}")
    check(done.get("tensor_parallel") == t and done.get("pipeline_stages") == p and
          done.get("data_parallel") == d, f"{tag}: done event reports the grid "
          f"{done.get('data_parallel')}, {done.get('pipeline_stages')}, {done.get('tensor_parallel')}")
    check(sorted(params) == sorted(ref), f"{tag}: model.h5 tensors {sorted(set(params) ^ set(ref))} differ")
    worst_ref = worst_upd = 0.0
    for k in ref:
        if k not in params or params[k].shape != ref[k].shape:
            check(False, f"{tag}: {k} has shape {params[k].shape if k in params else None}, "
                  f"the reference {ref[k].shape}")
            continue
        diff = float(np.max(np.abs(params[k].astype(np.float64) - ref[k])))
        worst_ref = max(worst_ref, diff / scale[k])
        worst_upd = max(worst_upd, diff / update[k])
        check(diff <= PARAM_TOL_REF * scale[k] and diff <= PARAM_TOL_UPDATE * update[k],
              f"{tag}: {k} differs by {diff:.3e} (max|ref| {scale[k]:.3e}, update {update[k]:.3e})")
    print(f"(data, pipeline, tensor) = ({d}, {p}, {t}): losses within {lr:.2e} relative, "
          f"validation loss within {vr:.2e}, parameters within {worst_ref:.2e} x max|ref| and "
          f"{worst_upd:.2e} x the update")

# Recompute changes where activations come from, not the arithmetic.
_, ls, _ = train("d1p2t2-recompute", 1, 2, 2, ["--train.recompute", "block"])
same = np.array_equal(ls, runs["d1p2t2"])
check(same, "(1,2,2) with recompute = block: losses differ from without")
print(f"(1, 2, 2) with train.recompute = block: losses {'bitwise equal' if same else 'DIFFER'}")

# A checkpoint written on one grid resumes on others.
ck_out, _, _ = train("ckpt-writer", 1, 2, 2, ["--checkpoint.every_steps", "15",
                                               "--checkpoint.keep_last", "5"])
ck = os.path.join(ck_out, "checkpoints", "ckpt-000000015.h5")
with h5py.File(ck, "r") as f:
    grid = [int(v) for v in f.attrs["grid"]]
    shapes = {}
    f["params"].visititems(lambda n, o: shapes.__setitem__(n, o.shape)
                           if isinstance(o, h5py.Dataset) else None)
check({k: ref[k].shape for k in ref} == shapes, "the (1,2,2) checkpoint's tensors are not the "
      "whole model's")
check(grid == [4, 1, 2, 2], f"the checkpoint's grid attribute is {grid}, expected [ranks 4, data 1, "
      "pipeline 2, tensor 2]")
for d, p, t in ((2, 1, 2), (1, 1, 1)):
    tag = f"resume-d{d}p{p}t{t}"
    out = os.path.join(work, f"gpt-grid-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    _, ls, _ = train(tag, d, p, t, ["--resume", ck], fresh=False)
    lr = rel(ls, ref_loss[15:]) if len(ls) == STEPS - 15 else float("inf")
    check(len(ls) == STEPS - 15, f"{tag}: logged {len(ls)} losses after the resume, expected 15")
    check(lr <= LOSS_RTOL, f"{tag}: steps 16-30 differ from the reference by {lr:.2e} relative")
    print(f"checkpoint of (1, 2, 2) at step 15 resumed on ({d}, {p}, {t}): steps 16-30 within "
          f"{lr:.2e} relative of the reference")

check.finish()
