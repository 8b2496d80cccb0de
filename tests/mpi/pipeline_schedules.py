#!/usr/bin/python3
"""The zero-bubble (zb-h1, zb-h2) and interleaved schedules give 1f1b's training, bit for bit,
within their memory bounds.

Backward split into B (input gradients) and W (parameter gradients) runs the same kernels on
the same operands as the whole backward, and every schedule sums a stage's gradients in
micro-batch order; so, with the same seed and grid, 30 steps must end in bitwise-identical
parameters and losses:
  - the deep MLP (8 linear layers, dropout), a CNN with conv + max-pool (the fused layer) and
    a 2-block GPT (dropout; the embedding and the tied LM head on different stages): P = 2,
    M = 4, zb-h1 and zb-h2 against 1f1b; gpipe too (the memory check below reads it);
  - the deep MLP on P = 4 (4 ranks), and on P = 2 x D = 2 (the gradient allreduce starts in the
    last W); the GPT on P = 2 x T = 2 (tensor parallel: B's sums over the tensor group), and
    with train.recompute = "block" (a block that recomputes runs whole in B);
  - interleaved, 2 chunks per stage (each stage holds every other chunk of the model): the
    three models on P = 2 and on P = 4 (the GPT with 6 blocks there, for 8 chunks); the deep
    MLP on P = 2 x D = 2 (also with ZeRO-2), the GPT on P = 2 x T = 2;
  - zb-h2 and interleaved on --device cpu-staged (the GPU path's host/device logic, CPU ops);
  - a checkpoint written at step 15 by zb-h2 resumed by 1f1b, one by 1f1b resumed by zb-h1,
    one by interleaved resumed by 1f1b and one by 1f1b resumed by interleaved end bitwise
    equal to the uninterrupted 1f1b run.
Memory, from each run's done event: peak_live_microbatches equals live_microbatches_bound and
the schedule's formula (1f1b min(P-s, M), zb-h1 min(P, M), zb-h2 min(2P-1, M), gpipe M;
interleaved min(2(P-s-1) + (v-1)P + 1, vM) chunk-micro-batches); the activation memory per
stage is at most the bound x the largest micro-batch (chunk) the stage held
(microbatch_activation_mb), and, but for interleaved, whose chunks differ, at most the bound x
gpipe's peak / M. A --trace run of zb-h1 shows a "backward B m" and a "backward W m" span
for every micro-batch on every stage, and one of interleaved a "forward m.c" per chunk.

Usage: zero_bubble.py STRATA DATA.h5 WORKDIR
Every figure measured is printed.
"""
import json
import os
import shutil
import sys

import numpy as np

from common import art_text, Checks, losses, metrics, parameters, run_strata

strata, data, work = sys.argv[1:4]
work = os.path.join(work, "pipeline-schedules")
os.makedirs(work, exist_ok=True)
text = art_text(strata, work)
STEPS, M = 30, 4
MODELS = {
    "mlp-deep": ["--data.path", data, "--model.type", "mlp", "--model.hidden"] + ["128"] * 7 +
                ["--model.dropout", "0.1", "--train.optimizer", "adamw", "--train.lr", "0.001",
                 "--train.batch_size", "64"],
    # 8 layers as the model summary lists them (conv + maxpool + relu and linear + relu run as
    # one each): 8 chunks at P = 4 interleaved.
    "cnn": ["--data.path", data, "--model.type", "custom", "--model.layers", "conv 8 3 1 1",
            "maxpool 2 2", "relu", "conv 16 3 1 1", "maxpool 2 2", "relu", "flatten", "dropout 0.1",
            "linear 32", "relu", "linear 32", "relu", "dropout 0.1", "linear 10", "--train.lr",
            "0.05", "--train.batch_size", "32"],
    "gpt": ["--data.path", text, "--model.type", "gpt", "--model.layers", "2", "--model.heads", "4",
            "--model.dim", "32", "--model.context", "16", "--model.dropout", "0.1",
            "--train.optimizer", "adamw", "--train.lr", "0.003", "--train.grad_clip", "0.5",
            "--train.batch_size", "8"],
}
MODELS["gpt6"] = [a if a != "2" or i != MODELS["gpt"].index("--model.layers") + 1 else "6"
                  for i, a in enumerate(MODELS["gpt"])]  # 6 blocks: 9 layers, for 8 chunks
V = 2  # chunks per stage, interleaved
BOUND = {"1f1b": lambda P, s: min(P - s, M), "zb-h1": lambda P, s: min(P, M),
         "zb-h2": lambda P, s: min(2 * P - 1, M), "gpipe": lambda P, s: M,
         "interleaved": lambda P, s: min(2 * (P - s - 1) + (V - 1) * P + 1, V * M)}
check = Checks()


def train(model, tag, P, schedule, ranks=None, more=(), steps=STEPS):
    out = os.path.join(work, f"{model}-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    if schedule == "interleaved":
        more = list(more) + ["--parallel.virtual_stages", str(V)]
    run_strata(strata, ranks or P, ["train"] + MODELS[model] + [
        "--train.max_steps", str(steps), "--train.log_every", "1", "--train.seed", "7",
        "--parallel.pipeline_stages", str(P), "--parallel.microbatches", str(M),
        "--parallel.schedule", schedule, "--output.dir", out, "--quiet"] + list(more))
    done = [m for m in metrics(os.path.join(out, "metrics.jsonl")) if m.get("event") == "done"][-1]
    return out, losses(os.path.join(out, "metrics.jsonl")), parameters(os.path.join(out, "model.h5")), done


def same(a, b):
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def compare(what, run, base):
    (_, la, pa, _), (_, lb, pb, _) = run, base
    ok_p, ok_l = same(pa, pb), la.tobytes() == lb.tobytes() and len(la) == len(lb)
    worst = max(float(np.max(np.abs(pa[k].astype(np.float64) - pb[k]))) for k in pa) if pa.keys() == pb.keys() else -1
    print(f"  {what}: parameters bitwise equal {ok_p} ({len(pa)} tensors, max|a-b| {worst:.3e}), "
          f"losses bitwise equal {ok_l} (final {la[-1]:.6f})")
    check(ok_p, f"{what}: parameters differ")
    check(ok_l, f"{what}: losses differ")


def memory(what, done, P, schedule, per_micro):
    peak, bound = done.get("peak_live_microbatches"), done.get("live_microbatches_bound")
    want = [BOUND[schedule](P, s) for s in range(P)]
    mb, one = done.get("peak_activation_mb"), done.get("microbatch_activation_mb")
    gp = f", bound x gpipe's per micro-batch {[round(w * u, 3) for w, u in zip(want, per_micro)]}" \
        if schedule != "interleaved" else ""
    print(f"  {what}: peak live micro-batches {peak}, bound {bound} (formula {want}); activation MB "
          f"{mb} (bound x the largest micro-batch held {[round(w * u, 3) for w, u in zip(want, one)]}{gp}); "
          f"idle share {done.get('stage_idle_share')}, theory {done.get('stage_bubble_theory')}")
    check(peak == want and bound == want, f"{what}: peak live {peak}, bound {bound}, expected {want}")
    # Every schedule: at most the bound x the largest micro-batch (chunk) a stage held.
    check(all(m <= w * u * (1 + 1e-6) + 1e-3 for m, w, u in zip(mb, want, one)),
          f"{what}: activation memory {mb} above the bound x one micro-batch's {one}")
    if schedule != "interleaved":
        check(all(m <= w * u * (1 + 1e-6) + 1e-3 for m, w, u in zip(mb, want, per_micro)),
              f"{what}: activation memory {mb} above the bound")


for model in ("mlp-deep", "cnn", "gpt"):
    print(f"{model}, P = 2, M = {M}, {STEPS} steps:")
    base = train(model, "1f1b", 2, "1f1b")
    gp = train(model, "gpipe", 2, "gpipe")
    per_micro = [v / M for v in gp[3]["peak_activation_mb"]]
    memory("1f1b", base[3], 2, "1f1b", per_micro)
    memory("gpipe", gp[3], 2, "gpipe", per_micro)
    compare("gpipe vs 1f1b", gp, base)
    for schedule in ("zb-h1", "zb-h2", "interleaved"):
        run = train(model, schedule, 2, schedule)
        compare(f"{schedule} vs 1f1b", run, base)
        memory(schedule, run[3], 2, schedule, per_micro)

print("mlp-deep, P = 4 (4 ranks):")
base4 = train("mlp-deep", "p4-1f1b", 4, "1f1b")
gp4 = train("mlp-deep", "p4-gpipe", 4, "gpipe")
per_micro4 = [v / M for v in gp4[3]["peak_activation_mb"]]
for schedule in ("zb-h1", "zb-h2", "interleaved"):
    run = train("mlp-deep", f"p4-{schedule}", 4, schedule)
    compare(f"P=4 {schedule} vs 1f1b", run, base4)
    memory(f"P=4 {schedule}", run[3], 4, schedule, per_micro4)
for model in ("cnn", "gpt6"):
    print(f"{model}, P = 4 (4 ranks), interleaved with {V} chunks per stage:")
    run = train(model, "p4-interleaved", 4, "interleaved")
    compare(f"P=4 interleaved vs 1f1b", run, train(model, "p4-1f1b", 4, "1f1b"))
    memory("P=4 interleaved", run[3], 4, "interleaved", [0] * 4)

base = train("mlp-deep", "1f1b-again", 2, "1f1b")
print("mlp-deep, P = 2 x D = 2 (4 ranks):")
d2 = train("mlp-deep", "d2-1f1b", 2, "1f1b", ranks=4)
compare("P=2 D=2 zb-h1 vs 1f1b", train("mlp-deep", "d2-zb-h1", 2, "zb-h1", ranks=4), d2)
compare("P=2 D=2 interleaved vs 1f1b", train("mlp-deep", "d2-interleaved", 2, "interleaved", ranks=4), d2)
zero = ["--parallel.zero", "2"]
compare("P=2 D=2 ZeRO-2 interleaved vs 1f1b", train("mlp-deep", "z2-interleaved", 2, "interleaved", ranks=4, more=zero),
        train("mlp-deep", "z2-1f1b", 2, "1f1b", ranks=4, more=zero))
print("gpt, P = 2 x T = 2 (4 ranks), and with recompute:")
tp = ["--parallel.tensor", "2"]
t2 = train("gpt", "t2-1f1b", 2, "1f1b", ranks=4, more=tp)
compare("P=2 T=2 zb-h2 vs 1f1b", train("gpt", "t2-zb-h2", 2, "zb-h2", ranks=4, more=tp), t2)
compare("P=2 T=2 interleaved vs 1f1b", train("gpt", "t2-interleaved", 2, "interleaved", ranks=4, more=tp), t2)
rc = ["--train.recompute", "block"]
compare("recompute zb-h1 vs 1f1b", train("gpt", "rc-zb-h1", 2, "zb-h1", more=rc),
        train("gpt", "rc-1f1b", 2, "1f1b", more=rc))

print("the GPU path's host/device logic (--device cpu-staged: CPU ops on separate memory), mlp-deep, P = 2:")
for schedule in ("zb-h2", "interleaved"):
    staged = train("mlp-deep", f"staged-{schedule}", 2, schedule, more=["--device", "cpu-staged"])
    compare(f"cpu-staged {schedule} vs cpu 1f1b", staged, base)
    allocs, frees = staged[3]["steady_device_allocs"], staged[3]["steady_device_frees"]
    print(f"  cpu-staged {schedule}: device allocations after step 2 per rank {allocs}, frees {frees}")
    check(not any(allocs) and not any(frees), f"cpu-staged {schedule}: device memory allocated in steady state")

print("checkpoints across schedules (mlp-deep, P = 2, written at step 15):")
for writer, reader in (("zb-h2", "1f1b"), ("1f1b", "zb-h1"), ("interleaved", "1f1b"), ("1f1b", "interleaved")):
    out, _, _, _ = train("mlp-deep", f"ck-{writer}", 2, writer, steps=15,
                         more=["--checkpoint.every_steps", "15", "--checkpoint.async", "false"])
    ck = os.path.join(out, "checkpoints", "ckpt-000000015.h5")
    res = train("mlp-deep", f"resume-{writer}-{reader}", 2, reader, more=["--resume", ck])
    check(len(res[1]) == STEPS - 15, f"{writer} -> {reader}: logged {len(res[1])} steps after the resume")
    compare(f"{writer} checkpoint resumed by {reader} vs 1f1b uninterrupted",
            (res[0], base[1][15:], res[2], res[3]), (base[0], base[1][15:], base[2], base[3]))
    check(res[1].tobytes() == base[1][15:].tobytes(), f"{writer} -> {reader}: losses of steps 16-30 differ")

def spans(tag, schedule, prefix, want):
    """A 3-step --trace run: every rank's spans named `prefix...` include `want`."""
    trace = os.path.join(work, f"{tag}.json")
    train("mlp-deep", tag, 2, schedule, more=["--trace", trace], steps=3)
    with open(trace) as fh:
        events = json.load(fh)["traceEvents"]
    names = {}
    for e in events:
        if e.get("name", "").startswith(prefix):
            names.setdefault(e["pid"], set()).add(e["name"])
    print(f"  {trace}: '{prefix}' spans per rank: {[sorted(v) for _, v in sorted(names.items())]}")
    check(len(names) == 2 and all(want <= v for v in names.values()),
          f"trace {tag}: expected {sorted(want)} on both ranks")


print("traces (mlp-deep, P = 2): zb-h1's B and W apart, interleaved's chunks:")
spans("trace-zb-h1", "zb-h1", "backward ", {f"backward {k} {m}" for k in "BW" for m in range(M)})
spans("trace-interleaved", "interleaved", "forward ", {f"forward {m}.{c}" for c in range(V) for m in range(M)})
check.finish()
