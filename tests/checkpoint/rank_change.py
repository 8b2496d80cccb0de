"""A checkpoint written on one grid continues on another: 2 ranks -> 1 and 1 -> 4 follow the
uninterrupted run's loss curve to within 1e-5 relative (same global batch and data order; only
the order of the gradient sum differs). Usage: rank_change.py STRATA DATA WORKDIR"""
import os
import shutil
import sys

from ckpt_common import fail, fresh, run, train_losses

strata, data, work = sys.argv[1], sys.argv[2], fresh(os.path.join(sys.argv[3], "rank-change"))
common = ["--data.path", data, "--model.hidden", "128", "64", "--model.dropout", "0.1",
          "--train.batch_size", "64", "--train.max_steps", "300", "--train.seed", "11",
          "--train.optimizer", "adamw", "--train.lr", "0.002", "--train.log_every", "1",
          "--checkpoint.every_steps", "100", "--checkpoint.keep_last", "5", "--progress", "off"]
worst = 0.0
for before, after in ((2, 1), (1, 4)):
    ref = os.path.join(work, f"ref-{before}")
    run(strata, before, common + ["--output.dir", ref])
    d = fresh(os.path.join(work, f"{before}-to-{after}"))
    os.makedirs(os.path.join(d, "checkpoints"))
    shutil.copy(os.path.join(ref, "checkpoints", "ckpt-000000100.h5"), os.path.join(d, "checkpoints"))
    out, _ = run(strata, after, common + ["--output.dir", d, "--resume", "auto"])
    if "at step 100" not in out:
        fail(f"{before}->{after}: did not resume at step 100:\n{out[-1500:]}")
    a, b = train_losses(os.path.join(ref, "metrics.jsonl")), train_losses(os.path.join(d, "metrics.jsonl"))
    steps = sorted(b)
    if steps != list(range(101, 301)):
        fail(f"{before}->{after}: resumed run logged steps {steps[:3]}..{steps[-3:]}")
    rel = max(abs(b[s] - a[s]) / abs(a[s]) for s in steps)
    worst = max(worst, rel)
    print(f"{before} -> {after} ranks: max relative loss difference over steps 101-300: {rel:.3e}")
    if rel > 1e-5:
        fail(f"{before}->{after}: loss curve differs by {rel:.3e} > 1e-5")
print(f"PASS (worst {worst:.3e})")
