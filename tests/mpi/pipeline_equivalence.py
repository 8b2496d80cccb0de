#!/usr/bin/python3
"""Pipeline equivalence: pipeline stages (P) x data-parallel replicas (D) with the same global
batch and seed follow the one-rank run.

For (P, D) in (2, 1), (2, 2), (4, 1) (P*D ranks) and both schedules (gpipe, 1f1b), 30 steps of
global batch 64 in 4 micro-batches:
  - the loss sequence follows the one-rank, one-stage reference within 1e-5 relative (max over
    steps);
  - the final parameters (model.h5, global names) agree with the reference per tensor within
    1e-4 x max|ref| and within 1e-2 x max|ref - init| (see TOLERANCES below);
  - the test-set evaluation at the end (the whole model, gathered from the stages) gives the reference's test loss
    within 1e-5 relative and its accuracy but for at most 2 of the 10 000 samples;
  - the done event reports the grid (pipeline_stages, microbatches, schedule) and the peak
    number of micro-batches whose activations a stage held at once: 1f1b: min(P - s, M) on
    stage s; gpipe: M on every stage;
(2, 2) 1f1b with --parallel.placement pipeline_in_node and (4, 1) 1f1b with --parallel.balance
measured pass the same checks, and (2, 2) 1f1b
run twice gives bitwise-identical parameters and losses, the second time with
--trace (which must change nothing; the trace has one row per rank and the forward and backward
spans of every micro-batch).

Usage: pipeline_equivalence.py STRATA DATA.h5 WORKDIR MODEL(mlp-deep|cnn)
Every figure measured is printed.
"""
import json
import os
import sys

import numpy as np

from common import Checks, losses, metrics, parameters, run_strata

strata, data, work, model = sys.argv[1:5]
STEPS = 30
GLOBAL_BATCH = 64
M = 4  # micro-batches per replica
GRIDS = ((2, 1), (2, 2), (4, 1))  # (P, D)
SCHEDULES = ("gpipe", "1f1b")

# TOLERANCES. A pipeline computes the same sum of per-sample gradient contributions as one rank,
# grouped differently: per micro-batch GEMMs accumulated over micro-batches, and with D > 1
# an allreduce over replicas. That is fp32 rounding, ~1e-7 relative per step, growing slowly.
#  - Losses: 1e-5 relative, the same bound as data parallelism (dp_equivalence.py).
#  - Parameters, measured for data parallelism at 2 and 4 ranks with these two models and
#    settings (30 steps, the same seeds): max|a - b| per tensor <= 1.7e-5 x max|ref| (AdamW on
#    mlp-deep; AdamW divides by sqrt(v), so elements with tiny gradients carry the rounding
#    of g/|g| into the update) and <= 3e-7 x max|ref| (SGD on cnn); relative to the tensor's
#    whole update over the 30 steps, max|ref - init|, at most 6.4e-5.
#    Bounds: (a) 1e-4 x max|ref| (the scale of the weights), and (b) 1e-2 x max|ref - init|
#    (the scale of what training changed: a stage that skips a micro-batch, scales a gradient
#    wrongly or misses an update is off by O(1) of it, 100x this bound; rounding is >100x below).
#    Both are deterministic (same code, same numbers), so the margins cannot flake.
LOSS_RTOL = 1e-5
PARAM_TOL_REF = 1e-4
PARAM_TOL_UPDATE = 1e-2
# Test accuracy after the evaluation with the gathered whole model: at most 2 of the 10 000 test samples may
# change their prediction (near-ties of the two top logits under fp32 rounding).
TEST_ACC_TOL = 2.5e-4

MODELS = {
    # 8 linear layers (7 hidden of 128 + the output), dropout after each hidden one: the masks
    # are keyed on the global sample position, so every stage of every grid must draw the same.
    # AdamW: with PyTorch's default init, SGD barely moves this deep ReLU stack in 30 steps
    # (loss 2.30 -> 2.31); AdamW takes it to ~1.6, so the comparison sees real training.
    "mlp-deep": (["--model.type", "mlp", "--model.hidden"] + ["128"] * 7 +
                 ["--model.dropout", "0.1", "--train.optimizer", "adamw"], "0.001"),
    # The strided CNN of dp_equivalence.py: no max-pool, whose argmax can route a gradient
    # differently under fp32 rounding of a different summation order (see there).
    "cnn": (["--model.type", "custom", "--model.layers", "conv 8 3 2 1", "relu", "conv 16 3 2 1",
             "relu", "flatten", "dropout 0.1", "linear 32", "relu", "linear 10"], "0.05"),
}
if model not in MODELS:
    sys.exit(f"unknown MODEL {model!r}: one of {', '.join(MODELS)}")
extra, LR = MODELS[model]


def train(tag, ranks, pipeline_args, lr=LR, steps=STEPS):
    out = os.path.join(work, f"pipeline-{model}-{tag}")
    os.makedirs(out, exist_ok=True)
    for f in ("metrics.jsonl", "model.h5"):
        if os.path.exists(os.path.join(out, f)):
            os.remove(os.path.join(out, f))
    run_strata(strata, ranks, ["train", "--data.path", data, "--train.batch_size", str(GLOBAL_BATCH),
                               "--train.max_steps", str(steps), "--train.log_every", "1",
                               "--train.seed", "7", "--train.lr", lr, "--output.dir", out,
                               "--quiet"] + extra + pipeline_args)
    ms = metrics(os.path.join(out, "metrics.jsonl"))
    done = [m for m in ms if m.get("event") == "done"]
    if not done:
        sys.exit(f"FAIL: {tag}: no done event in {out}/metrics.jsonl")
    return losses(os.path.join(out, "metrics.jsonl")), parameters(os.path.join(out, "model.h5")), done[-1]


check = Checks()


# The initial parameters: one step at lr 1e-30 changes no weight (the update is far below half
# an ulp of any weight), so model.h5 holds the initialisation (seeded per tensor by name).
_, init, _ = train("init", 1, [], lr="1e-30", steps=1)
ref_loss, ref, ref_done = train("ref", 1, [])
check(len(ref_loss) == STEPS, f"reference logged {len(ref_loss)} losses, expected {STEPS}")
print(f"{model}: reference (1 rank, P=1): loss {ref_loss[0]:.4f} -> {ref_loss[-1]:.4f} over {STEPS} steps; "
      f"{len(ref)} tensors; done: pipeline_stages={ref_done.get('pipeline_stages')} "
      f"microbatches={ref_done.get('microbatches')} schedule={ref_done.get('schedule')}")
check(ref_done.get("pipeline_stages") == 1, f"reference done event: pipeline_stages = "
      f"{ref_done.get('pipeline_stages')!r}, expected 1")
update = {k: float(np.max(np.abs(ref[k].astype(np.float64) - init[k]))) for k in ref}
scale = {k: float(np.max(np.abs(ref[k].astype(np.float64)))) for k in ref}
for k in ref:
    check(update[k] > 0, f"reference tensor {k} did not change in training")

runs = {}


def check_grid(tag, P, D, schedule, more=()):
    args = ["--parallel.pipeline_stages", str(P), "--parallel.microbatches", str(M),
            "--parallel.schedule", schedule] + list(more)
    got_loss, got, done = train(tag + "-a", P * D, args)
    print(f"{model}: {tag} ({P * D} ranks{', ' + ' '.join(more) if more else ''}):")
    if len(got_loss) != STEPS:
        check(False, f"{tag}: logged {len(got_loss)} losses, expected {STEPS}")
        return None
    rel = np.abs(got_loss - ref_loss) / np.abs(ref_loss)
    print(f"  loss: max relative difference over {STEPS} steps = {np.max(rel):.3e} "
          f"(step {int(np.argmax(rel)) + 1}; bound {LOSS_RTOL:g})")
    check(np.max(rel) <= LOSS_RTOL, f"{tag}: loss differs by {np.max(rel):.3e} > {LOSS_RTOL:g}")

    check(got.keys() == ref.keys(), f"{tag}: model.h5 tensors {sorted(got)} != reference {sorted(ref)}")
    worst_ref, worst_upd, worst_k = 0.0, 0.0, None
    for k in sorted(ref.keys() & got.keys()):
        if got[k].shape != ref[k].shape:
            check(False, f"{tag}: {k} has shape {got[k].shape}, reference {ref[k].shape}")
            continue
        d = float(np.max(np.abs(got[k].astype(np.float64) - ref[k])))
        r_ref, r_upd = d / scale[k], d / update[k]
        print(f"    {k:14s} max|a-b| {d:.3e} = {r_ref:.2e} x max|ref| = {r_upd:.2e} x max|ref-init|")
        check(r_ref <= PARAM_TOL_REF, f"{tag}: {k} differs by {r_ref:.3e} x max|ref| > {PARAM_TOL_REF:g}")
        check(r_upd <= PARAM_TOL_UPDATE,
              f"{tag}: {k} differs by {r_upd:.3e} x max|ref - init| > {PARAM_TOL_UPDATE:g}")
        if r_ref >= worst_ref:
            worst_ref, worst_k = r_ref, k
        worst_upd = max(worst_upd, r_upd)
    print(f"  parameters: worst {worst_ref:.2e} x max|ref| ({worst_k}; bound {PARAM_TOL_REF:g}), "
          f"worst {worst_upd:.2e} x max|ref-init| (bound {PARAM_TOL_UPDATE:g})")

    # The test-set evaluation uses the whole model gathered from the stages: the same loss to rounding, and the
    # same predictions but for samples whose two top logits are within rounding of each other.
    acc, tl = done.get("test_accuracy"), done.get("test_loss")
    print(f"  test: accuracy {acc} (reference {ref_done.get('test_accuracy')}), loss {tl} "
          f"(reference {ref_done.get('test_loss')})")
    check(acc is not None and abs(acc - ref_done["test_accuracy"]) <= TEST_ACC_TOL,
          f"{tag}: test accuracy {acc} vs reference {ref_done['test_accuracy']} (bound {TEST_ACC_TOL:g})")
    check(tl is not None and abs(tl - ref_done["test_loss"]) <= LOSS_RTOL * abs(ref_done["test_loss"]),
          f"{tag}: test loss {tl} vs reference {ref_done['test_loss']} (bound {LOSS_RTOL:g} relative)")

    check(done.get("pipeline_stages") == P, f"{tag}: done pipeline_stages = {done.get('pipeline_stages')!r}, expected {P}")
    check(done.get("microbatches") == M, f"{tag}: done microbatches = {done.get('microbatches')!r}, expected {M}")
    check(done.get("schedule") == schedule, f"{tag}: done schedule = {done.get('schedule')!r}, expected {schedule!r}")
    peak = done.get("peak_live_microbatches")
    want = [min(P - s, M) for s in range(P)] if schedule == "1f1b" else [M] * P
    print(f"  peak_live_microbatches per stage = {peak} (expected {want}); "
          f"stage_idle_share = {done.get('stage_idle_share')}; samples_per_s = {done.get('samples_per_s')}")
    check(peak == want, f"{tag}: peak_live_microbatches = {peak!r}, expected {want}")
    idle = done.get("stage_idle_share")
    check(isinstance(idle, list) and len(idle) == P and all(0.0 <= float(v) <= 1.0 for v in idle),
          f"{tag}: stage_idle_share = {idle!r}, expected {P} values in [0, 1]")
    return got_loss, got


for P, D in GRIDS:
    for schedule in SCHEDULES:
        runs[(P, D, schedule)] = check_grid(f"P{P}-D{D}-{schedule}", P, D, schedule)

# The other rank placement (a pipeline's stages on consecutive ranks): the same arithmetic.
placed = check_grid("P2-D2-1f1b-pipeline_in_node", 2, 2, "1f1b", ["--parallel.placement", "pipeline_in_node"])
if placed and runs[(2, 2, "1f1b")]:
    (la, pa), (lb, pb) = runs[(2, 2, "1f1b")], placed
    print(f"{model}: (info) P2-D2-1f1b placements replicas_in_node and pipeline_in_node: parameters bitwise "
          f"identical = {pa.keys() == pb.keys() and all(pa[k].tobytes() == pb[k].tobytes() for k in pa)}, "
          f"losses identical = {la.tobytes() == lb.tobytes()}")
# A partition balanced by measured layer times (rank 0 times them; every rank must use its
# partition): whatever partition it picks, the numbers are the same.
measured = check_grid("P4-D1-1f1b-balance_measured", 4, 1, "1f1b", ["--parallel.balance", "measured"])
if placed is None or measured is None or any(v is None for v in runs.values()):  # the comparisons below need them all
    print("FAIL")
    sys.exit(1)

# For information (not required): with one replica the gradient sums run in the same order
# whatever P (micro-batch by micro-batch), so P=2 and P=4 may agree bit for bit.
for schedule in SCHEDULES:
    (l2, p2), (l4, p4) = runs[(2, 1, schedule)], runs[(4, 1, schedule)]
    same = p2.keys() == p4.keys() and all(p2[k].tobytes() == p4[k].tobytes() for k in p2)
    print(f"{model}: (info) P2-D1-{schedule} and P4-D1-{schedule}: parameters bitwise identical = {same}, "
          f"losses identical = {l2.tobytes() == l4.tobytes()}")
(lg, pg), (l1, p1) = runs[(2, 1, "gpipe")], runs[(2, 1, "1f1b")]
print(f"{model}: (info) P2-D1 gpipe and 1f1b: parameters bitwise identical = "
      f"{pg.keys() == p1.keys() and all(pg[k].tobytes() == p1[k].tobytes() for k in pg)}, "
      f"losses identical = {lg.tobytes() == l1.tobytes()}")

# Determinism: the same grid twice is bitwise identical (losses and parameters). The second run
# also writes a trace (--trace), which must change nothing, and the trace is checked: one row
# per rank, each with TRACE_STEPS x M forward and backward compute spans.
P, D, schedule = 2, 2, "1f1b"
TRACE_STEPS = 2
trace_path = os.path.join(work, f"pipeline-{model}-trace.json")
if os.path.exists(trace_path):
    os.remove(trace_path)
again_loss, again, _ = train(f"P{P}-D{D}-{schedule}-b", P * D,
                             ["--parallel.pipeline_stages", str(P), "--parallel.microbatches", str(M),
                              "--parallel.schedule", schedule, "--trace", trace_path,
                              "--trace_steps", str(TRACE_STEPS)])
try:
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    per_rank = {r: sum(1 for e in spans if e["pid"] == r and e.get("cat") == "compute") for r in rows}
    kinds = sorted({e.get("cat") for e in spans})
    print(f"{model}: trace of {TRACE_STEPS} steps: {len(events)} events, rows {sorted(rows)}, compute spans per "
          f"rank {per_rank}, categories {kinds}")
    check(sorted(rows) == list(range(P * D)), f"trace rows {sorted(rows)}, expected ranks 0..{P * D - 1}")
    check(all(n == 2 * M * TRACE_STEPS for n in per_rank.values()),
          f"trace: compute spans per rank {per_rank}, expected {2 * M * TRACE_STEPS} (forward and backward "
          f"of {M} micro-batches x {TRACE_STEPS} steps)")
    check(all(e["dur"] >= 0 for e in spans), "trace: a span with negative duration")
except (OSError, ValueError, KeyError, TypeError) as e:
    check(False, f"trace {trace_path}: {type(e).__name__}: {e}")
first_loss, first = runs[(P, D, schedule)]
same_p = first.keys() == again.keys() and all(first[k].tobytes() == again[k].tobytes() for k in first)
same_l = first_loss.tobytes() == again_loss.tobytes()
print(f"{model}: P{P}-D{D}-{schedule} twice: parameters bitwise identical = {same_p} ({len(first)} tensors), "
      f"losses identical = {same_l}")
check(same_p and same_l, f"P{P}-D{D}-{schedule} twice differs (parameters {same_p}, losses {same_l})")

check.finish()
