"""Kill-and-resume is exact: a run killed with SIGKILL at random moments (several times) and
resumed with --resume auto ends with parameters bitwise identical to an uninterrupted run with
the same rank count. Usage: kill_resume.py STRATA DATA WORKDIR RANKS"""
import os
import random
import signal
import sys
import time

from ckpt_common import assert_bitwise, fail, fresh, launch, metrics, run

strata, data, work, ranks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
work = fresh(os.path.join(work, f"kill-resume-{ranks}"))
steps = 1000
common = ["--data.path", data, "--model.hidden", "128", "--model.dropout", "0.1",
          "--train.max_steps", str(steps), "--train.lr", "0.05", "--train.lr_schedule", "cosine",
          "--train.warmup_steps", "50", "--train.seed", "7", "--checkpoint.every_steps", "40",
          "--train.log_every", "20", "--progress", "off"]

ref = os.path.join(work, "ref")
t0 = time.time()
run(strata, ranks, common + ["--output.dir", ref])
ref_s = time.time() - t0

seed = int(os.environ.get("KILL_SEED", time.time_ns() % 100000))
rng = random.Random(seed)
print(f"uninterrupted: {ref_s:.1f} s; kill times drawn with KILL_SEED={seed}")
out_dir = os.path.join(work, "killed")
kills, resumed_from = 0, []
for attempt in range(12):
    p = launch(strata, ranks, common + ["--output.dir", out_dir, "--resume", "auto"])
    if kills < 3:
        # Kill after the first checkpoint of this attempt has been written, at a random moment
        # (possibly in the middle of a step or of a checkpoint write).
        mpath = os.path.join(out_dir, "metrics.jsonl")
        start_lines = len(metrics(mpath)) if os.path.exists(mpath) else 0
        deadline = time.time() + 120
        while time.time() < deadline and p.poll() is None:
            ms = metrics(mpath)[start_lines:] if os.path.exists(mpath) else []
            if any(m.get("event") == "checkpoint" for m in ms):
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.35 * ref_s))
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the ranks and mpirun, no chance to clean up
            kills += 1
    out, err = p.communicate(timeout=600)
    for line in out.splitlines():
        if line.startswith("resumed from"):
            resumed_from.append(line)
            print(line)
    if p.returncode == 0:
        break
    if p.returncode != -signal.SIGKILL:
        fail(f"attempt {attempt} exited {p.returncode}\n{out[-2000:]}\n{err[-2000:]}")
else:
    fail("the run did not finish in 12 attempts")

if kills == 0 or not resumed_from:
    fail(f"no kill landed mid-run (kills={kills}); the test proved nothing")
print(f"killed {kills} times, resumed {len(resumed_from)} times")
assert_bitwise(os.path.join(ref, "model.h5"), os.path.join(out_dir, "model.h5"),
               f"{ranks} rank(s), killed {kills}x")
print("PASS")
