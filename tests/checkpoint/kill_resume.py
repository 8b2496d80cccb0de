"""Kill-and-resume is exact: a run killed with SIGKILL at random moments (several times) and
resumed with --resume auto ends with parameters bitwise identical to an uninterrupted run with
the same rank count. Usage: kill_resume.py STRATA DATA WORKDIR RANKS [TAG FLAGS...]: FLAGS are
added to every run (e.g. a pipeline grid), TAG names the work directory."""
import os
import random
import signal
import sys
import time

from ckpt_common import assert_bitwise, fail, fresh, kill_all, launch, metrics, metrics_so_far, run

strata, data, work, ranks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tag, extra = (sys.argv[5], sys.argv[6:]) if len(sys.argv) > 5 else ("", [])
work = fresh(os.path.join(work, f"kill-resume-{ranks}{tag}"))
steps = 1000
common = ["--data.path", data, "--model.hidden", "128", "--model.dropout", "0.1",
          "--train.epochs", "2", "--train.max_steps", str(steps), "--train.lr", "0.05", "--train.lr_schedule", "cosine",
          "--train.warmup_steps", "50", "--train.seed", "7", "--checkpoint.every_steps", "40",
          "--train.log_every", "10", "--progress", "off"] + extra

ref = os.path.join(work, "ref")
run(strata, ranks, common + ["--output.dir", ref])

seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100000))
rng = random.Random(seed)
print(f"kill points drawn with KILL_SEED={seed}")
out_dir = os.path.join(work, "killed")
kills, resumed_from = 0, []
for attempt in range(12):
    p = launch(strata, ranks, common + ["--output.dir", out_dir, "--resume", "auto"])
    if kills < 3:
        # Kill when the run has logged a randomly drawn step (so the kill lands wherever the
        # machine's speed puts it: inside a step, between steps, or during a checkpoint write),
        # at least one checkpoint after the point this attempt starts from.
        mpath = os.path.join(out_dir, "metrics.jsonl")
        done_before = max([m["step"] for m in metrics_so_far(mpath) if "event" not in m], default=0)
        target = rng.randint(done_before + 60, done_before + 60 + (steps - done_before - 60) // 3)
        while p.poll() is None:
            ms = metrics_so_far(mpath)
            if max([m["step"] for m in ms if "event" not in m], default=0) >= target:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.03))
        if p.poll() is None:
            kill_all(p)
            kills += 1
            print(f"killed after step {target} (+ up to 30 ms)")
    out, err = p.communicate(timeout=600)
    for line in out.splitlines():
        if line.startswith("resumed from"):
            print(line)
    mpath = os.path.join(out_dir, "metrics.jsonl")
    resumed_from = [m for m in metrics(mpath) if m.get("event") == "resumed"]
    if p.returncode == 0:
        break
    if p.returncode != -signal.SIGKILL:
        fail(f"attempt {attempt} exited {p.returncode}\n{out[-2000:]}\n{err[-2000:]}")
else:
    fail("the run did not finish in 12 attempts")

if kills == 0 or len(resumed_from) != kills:
    fail(f"{kills} kills but {len(resumed_from)} resumes logged; the test proved nothing")
print(f"killed {kills} times, resumed {len(resumed_from)} times")
assert_bitwise(os.path.join(ref, "model.h5"), os.path.join(out_dir, "model.h5"),
               f"{ranks} rank(s), killed {kills}x")
print("PASS")
