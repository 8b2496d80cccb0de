"""Resumable stops: SIGUSR1 (Slurm's warning signal, as forwarded by mpirun/srun) and the job's
time limit (STRATA_JOB_END_TIME, what strata otherwise reads from squeue) make every rank stop
at the same step, write a checkpoint and exit 75; --resume auto then ends bitwise identical to
an uninterrupted run. Usage: stop_resume.py STRATA DATA WORKDIR RANKS [TAG FLAGS...]: FLAGS are
added to every run (e.g. a pipeline grid), TAG names the work directory."""
import os
import signal
import sys
import time
import tomllib

from ckpt_common import assert_bitwise, fail, fresh, launch, metrics, metrics_so_far, run

strata, data, ranks = sys.argv[1], sys.argv[2], int(sys.argv[4])
tag, extra = (sys.argv[5], sys.argv[6:]) if len(sys.argv) > 5 else ("", [])
work = fresh(os.path.join(sys.argv[3], f"stop-resume-{ranks}{tag}"))
common = ["--data.path", data, "--model.hidden", "64", "--train.epochs", "7", "--train.max_steps", "6000",
          "--train.seed", "5", "--checkpoint.every_steps", "500", "--progress", "off"] + extra
ref = os.path.join(work, "ref")
t0 = time.time()
run(strata, ranks, common + ["--output.dir", ref])
ref_s = time.time() - t0


def stopped_then_resumed(name, start, env=None):
    d = os.path.join(work, name)
    p = launch(strata, ranks, common + ["--output.dir", d, "--resume", "auto"], env)
    start(p, d)
    out, err = p.communicate(timeout=600)
    if p.returncode != 75:
        fail(f"{name}: exited {p.returncode}, expected 75 (resumable)\n{out[-1500:]}\n{err[-1500:]}")
    stops = [m for m in metrics(os.path.join(d, "metrics.jsonl")) if m.get("event") == "stopped"]
    if len(stops) != 1 or stops[0]["step"] >= 6000:
        fail(f"{name}: expected one 'stopped' event before the end, got {stops}")
    step = stops[0]["step"]
    with open(os.path.join(d, "checkpoints", "latest")) as f:
        if f.read().strip() != f"ckpt-{step:09d}.h5":
            fail(f"{name}: the latest pointer does not name the stop checkpoint of step {step}")
    # The goodput ledger is at the stop's step and checkpoint, open for the next attempt.
    with open(os.path.join(d, "checkpoints", "goodput.toml"), "rb") as f:
        ledger = tomllib.load(f)
    if ledger.get("step") != step or ledger.get("state") != "running" or \
            ledger.get("checkpoint", [{}])[-1].get("step") != step:
        fail(f"{name}: goodput.toml says step {ledger.get('step')}, state {ledger.get('state')}, last "
             f"checkpoint {ledger.get('checkpoint', [{}])[-1].get('step')}; expected step {step}, running, {step}")
    print(f"{name}: stopped after step {step} with exit 75: {[l for l in out.splitlines() if l.startswith('stopped')]}")
    out, _ = run(strata, ranks, common + ["--output.dir", d, "--resume", "auto"])
    if f"at step {step} " not in out:
        fail(f"{name}: did not resume at step {step}:\n{out[-1500:]}")
    assert_bitwise(os.path.join(ref, "model.h5"), os.path.join(d, "model.h5"), name)
    return out


def send_usr1(p, d):
    mpath = os.path.join(d, "metrics.jsonl")
    while p.poll() is None and not any(m.get("event") == "checkpoint" for m in metrics_so_far(mpath)):
        time.sleep(0.01)
    p.send_signal(signal.SIGUSR1)  # to mpirun, which forwards it to every rank


stopped_then_resumed("sigusr1", send_usr1)

# The time limit: strata stops with a checkpoint a measured margin before the job's end time.
# strata's margin is 10 s plus twice its checkpoint write time plus three step times: with the
# end 12.5 s away the stop falls about 2.5 s after launch. The run asks for far more steps than
# fit, whatever this machine's speed; the resume then ends 300 steps after the stop
# (train.max_steps may change on resume; the schedule is constant), and an uninterrupted run of
# that many steps is the reference.
d = os.path.join(work, "time-limit")
long_run = ["--data.path", data, "--model.hidden", "64", "--train.epochs", "300",
            "--train.max_steps", "200000", "--train.seed", "5", "--checkpoint.every_steps", "500",
            "--progress", "off"] + extra
end = time.time() + 12.5
p = launch(strata, ranks, long_run + ["--output.dir", d, "--resume", "auto"],
           {"STRATA_JOB_END_TIME": f"{end:.3f}"})
out, err = p.communicate(timeout=600)
exited = time.time()
if p.returncode != 75:
    fail(f"time-limit: exited {p.returncode}, expected 75 (resumable)\n{out[-1500:]}\n{err[-1500:]}")
if exited >= end:
    fail(f"time-limit: strata exited {exited - end:.1f} s AFTER the job's end time")
stops = [m for m in metrics(os.path.join(d, "metrics.jsonl")) if m.get("event") == "stopped"]
if len(stops) != 1 or "time limit" not in out:
    fail(f"time-limit: expected one 'stopped' event for the time limit, got {stops}\n{out[-1500:]}")
step = stops[0]["step"]
print(f"time-limit: stopped after step {step}, exit 75, {end - exited:.1f} s before the job's end time")
final = [a if a != "200000" else str(step + 300) for a in long_run]
out, _ = run(strata, ranks, final + ["--output.dir", d, "--resume", "auto"])
if f"at step {step} " not in out:
    fail(f"time-limit: did not resume at step {step}:\n{out[-1500:]}")
ref2 = os.path.join(work, "ref-time-limit")
run(strata, ranks, final + ["--output.dir", ref2])
assert_bitwise(os.path.join(ref2, "model.h5"), os.path.join(d, "model.h5"), "time-limit")
print("PASS")
