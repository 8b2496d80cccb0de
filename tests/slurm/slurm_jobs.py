"""Fault tolerance on a real Slurm cluster (slurm/local-cluster.sh: two nodes on this host).

Each scenario submits slurm/train.sbatch for a small run over 2 nodes (1 rank each), interrupts
it the way a cluster does, lets Slurm and the script requeue it, and checks that it finishes
with parameters BITWISE identical to an uninterrupted 2-rank run (or, for the failure cases,
that it stops without requeueing). On any failure the job's log is printed.

    slurm_jobs.py SCENARIO --strata BIN --data FILE --work DIR --sbatch FILE --cluster DIR

SCENARIO: reference | node-failure | preempt-signal | time-limit | no-requeue |
          inherited-end-time | restart-killed | hang-exclude | restart-loop
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import h5py

from slurm_procs import find_rank_process, job_processes, parse_job

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "DEADLINE", "BOOT_FAIL", "PREEMPTED"}

# The run of the requeue tests: ~2 s of steps per rank pair when the machine is idle, long
# enough to interrupt after its first checkpoint, short enough for the suite.
STEPS = 3000
EVERY = 100


class Failure(Exception):
    pass


def fail(msg):
    raise Failure(msg)


class Ctx:
    def __init__(self, a):
        self.strata = os.path.abspath(a.strata)
        self.data = os.path.abspath(a.data)
        self.work = os.path.abspath(a.work)
        self.sbatch = os.path.abspath(a.sbatch)
        self.here = os.path.dirname(os.path.abspath(__file__))
        self.cluster = os.path.abspath(a.cluster)
        conf = os.path.join(self.cluster, "etc", "slurm.conf")
        if not os.path.exists(conf):
            fail(f"no Slurm cluster at {a.cluster} (the fixture 'slurm: cluster up' starts it)")
        # A clean environment for sbatch: nothing of an enclosing Slurm job leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "STRATA_"))}
        env.update(SLURM_CONF=conf, OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.env = env
        self.logs = []  # job logs to print on failure

    def sh(self, *cmd, check=True, env=None):
        p = subprocess.run(list(cmd), env=env or self.env, capture_output=True, text=True)
        if check and p.returncode != 0:
            fail(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
        return p


def write_config(path, out_dir, steps, data, every=EVERY, extra="", log_every=500, keep_last=3):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"""# written by tests/slurm/slurm_jobs.py
[data]
path = "{data}"
[model]
type = "mlp"
hidden = [32]
[train]
epochs = 1000
batch_size = 64
max_steps = {steps}
lr = 0.05
seed = 7
log_every = {log_every}
[checkpoint]
every_steps = {every}
keep_last = {keep_last}
[output]
dir = "{out_dir}"
{extra}""")


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def reference(ctx, name, steps, log_every=500):
    """The uninterrupted 2-rank run (mpirun) of config NAME; returns its parameter file."""
    d = os.path.join(ctx.work, f"ref-{name}")
    fresh(d)
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), steps, ctx.data, log_every=log_every)
    env = {k: v for k, v in ctx.env.items() if not k.startswith("OMPI_MCA_btl")}
    cmd = ["mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none", ctx.strata, "train",
           "--config", cfg, "--progress", "off"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        fail(f"reference run {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    model = os.path.join(d, "out", "model.h5")
    if not os.path.exists(model):
        fail(f"reference run wrote no {model}")
    return model


def submit(ctx, name, cfg, ckpt_dir=None, sbatch_args=(), strata_args=(), extra_env=None,
           strata=None):
    d = os.path.join(ctx.work, name)
    log = os.path.join(d, "job.log")
    env = dict(ctx.env, CONFIG=cfg, STRATA=strata or ctx.strata)
    if ckpt_dir:
        env["CKPT_DIR"] = ckpt_dir
    env.update(extra_env or {})
    cmd = ["sbatch", "--parsable", f"--job-name=t-{name}", "--nodes=2", "--ntasks-per-node=1",
           "--cpus-per-task=1", "--time=5", f"--output={log}", f"--chdir={d}", *sbatch_args,
           ctx.sbatch, *strata_args]
    p = ctx.sh(*cmd, env=env)
    job = p.stdout.strip().split(";")[0]
    if not job.isdigit():
        fail(f"sbatch printed no job id: {p.stdout!r}")
    ctx.logs.append((job, log))
    print(f"submitted job {job} ({name}): {' '.join(cmd[1:])}", flush=True)
    return job, log


def job_info(ctx, job):
    p = ctx.sh("scontrol", "-o", "show", "job", job, check=False)
    return parse_job(p.stdout) if p.returncode == 0 else None


def steps_left(ctx, job):
    """Files of the job's earlier steps still in the nodes' spool dirs (their slurmstepd is
    still cleaning up: a new step with the same id would fail to bind its PMIx socket), or
    its processes."""
    left = [f"pid {p}" for p in job_processes(job)]
    for node in ("n1", "n2"):
        d = os.path.join(ctx.cluster, "spool", node)
        try:
            names = os.listdir(d)
        except OSError:
            continue
        left += [n for n in names if f"_{job}." in n or f".pmix.{job}." in n]
    return left


PENDING_SINCE, CLEAN_SINCE = {}, {}


def release_if_waiting(ctx, job, info):
    """A requeued job waits ~120 s before it may start again (time for its old steps to be
    cleaned up); skip the wait once they have been gone for 3 s, and 2 s after the requeue at
    the earliest (slurmd refuses a job credential issued within the second its old one was
    revoked, "Job credential revoked", and a second copy of a job it still tracks, "already
    running", after which slurmctld drains the node)."""
    if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime":
        key = (job, info.get("Restarts"))
        now = time.time()
        since = PENDING_SINCE.setdefault(key, now)
        if steps_left(ctx, job):
            CLEAN_SINCE.pop(key, None)
            return
        clean = CLEAN_SINCE.setdefault(key, now)
        if now - since >= 2 and now - clean >= 3:
            ctx.sh("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)


def wait_job(ctx, job, timeout, on_poll=None, release=True):
    """Polls until the job is finished for good; returns its last scontrol record."""
    t0 = time.time()
    last = None
    while time.time() - t0 < timeout:
        info = job_info(ctx, job)
        if info is None:
            if last is None:
                fail(f"job {job} is not known to Slurm")
            return last  # purged after MinJobAge: its last state is final
        last = info
        if on_poll:
            on_poll(info)
        if release:
            release_if_waiting(ctx, job, info)
        if info.get("JobState") in TERMINAL:
            time.sleep(1.0)  # a requeue passes through states that look final; look again
            again = job_info(ctx, job)
            if again is None or again.get("JobState") in TERMINAL:
                return again or info
        time.sleep(0.25)
    ctx.sh("scancel", job, check=False)
    fail(f"job {job} did not finish within {timeout} s (last state {last and last.get('JobState')})")


def latest_step(ckpt_dir):
    try:
        with open(os.path.join(ckpt_dir, "latest")) as f:
            name = f.readline().strip()
    except OSError:
        return -1
    m = re.search(r"\d+", os.path.basename(name))  # ckpt-000000120.h5 -> 120
    return int(m.group(0)) if m else -1


def wait_first_checkpoint(ctx, job, ckpt_dir, timeout=180):
    """Waits until the running job has written a checkpoint; fails if it ends first."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        step = latest_step(ckpt_dir)
        info = job_info(ctx, job)
        state = info and info.get("JobState")
        if step > 0 and state == "RUNNING":
            print(f"job {job}: checkpoint at step {step} exists, job running", flush=True)
            return step
        if info is None or state in TERMINAL:
            fail(f"job {job} ended ({state}) before it could be interrupted after its first "
                 f"checkpoint (newest checkpoint step {step}); the run is too short for this machine")
        time.sleep(0.1)
    fail(f"job {job}: no checkpoint in {ckpt_dir} after {timeout} s")


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def attempts(log):
    """The script's lines per attempt: {attempt: [lines]}."""
    out = {}
    for line in log.splitlines():
        m = re.match(r"train\.sbatch: \[job \d+ attempt (\d+) ", line)
        if m:
            out.setdefault(int(m.group(1)), []).append(line)
    return out


def expect(cond, msg):
    if not cond:
        fail(msg)


def params(path):
    out = {}
    with h5py.File(path, "r") as f:
        if "params" not in f:
            fail(f"{path} has no /params group")
        f["params"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def expect_bitwise(model, ref, what="the uninterrupted run"):
    expect(os.path.exists(model), f"the job wrote no final parameters {model}")
    a, b = params(model), params(ref)
    expect(len(b) >= 4, f"reference {ref} holds only {sorted(b)}")
    expect(sorted(a) == sorted(b), f"{model} holds {sorted(a)}, the reference {sorted(b)}")
    for k in sorted(b):
        if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes():
            diff = abs(a[k].astype("float64") - b[k].astype("float64")).max() if a[k].shape == b[k].shape else "shape"
            fail(f"/params/{k} differs from {what} (max |diff| {diff}): {model} vs {ref}")
    print(f"final parameters bitwise identical to {what} ({len(b)} arrays)", flush=True)


def expect_completed_after_resume(info, log_path, restarts_min=1):
    log = read(log_path)
    expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
           f"job ended {info.get('JobState')} with exit {info.get('ExitCode')}, expected COMPLETED 0:0")
    restarts = int(info.get("Restarts", "0"))
    expect(restarts >= restarts_min, f"job was restarted {restarts} times, expected >= {restarts_min}")
    att = attempts(log)
    expect(len(att) == restarts + 1, f"the log shows attempts {sorted(att)}, Slurm counts {restarts} restarts")
    resumed = re.findall(r"resumed from (\S+) at step (\d+)", log)
    expect(resumed, "no 'resumed from <checkpoint> at step N' line in the log")
    for path, step in resumed:
        expect(0 < int(step) < STEPS_OF[0], f"resumed at step {step} (from {path}): not inside the run")
    # Bitwise equality needs the same rank count in every attempt.
    for a, lines in att.items():
        expect(any("(2 nodes, 2 tasks)" in l for l in lines),
               f"attempt {a} did not run on 2 nodes with 2 tasks: {lines[:1]}")
    expect(re.search(r"attempt \d+ .*\] done$", log, re.M), "the script did not log 'done'")
    return log, resumed


STEPS_OF = [STEPS]  # the running scenario's max_steps (for the resumed-step check)


# ---------------------------------------------------------------------------------------------
def scenario_reference(ctx):
    """The uninterrupted run the requeue scenarios compare with (a fixture)."""
    model = reference(ctx, "short", STEPS, log_every=10)  # the loss every 10 steps: hang-exclude
    print(f"reference: {model}")


def short_reference(ctx):
    model = os.path.join(ctx.work, "ref-short", "out", "model.h5")
    if not os.path.exists(model):
        fail(f"no reference run at {model} (the fixture 'slurm: uninterrupted reference run' makes it)")
    return model


def node_state(ctx, node):
    return ctx.sh("sinfo", "-h", "-n", node, "-o", "%t", check=False).stdout.strip()


def bring_back_n2(ctx, check=True):
    """ReturnToService=2 may already have brought n2 back when its slurmd re-registered."""
    t0 = time.time()
    while time.time() - t0 < 30:
        state = node_state(ctx, "n2")
        if state.startswith(("idle", "mix", "alloc")):
            return
        if state.startswith(("down", "drain")):
            ctx.sh("scontrol", "update", "nodename=n2", "state=resume", check=False)
        time.sleep(0.5)
    if check:
        fail(f"n2 did not come back after state=resume (state {node_state(ctx, 'n2')})")


def scenario_node_failure(ctx):
    """n2 goes down mid-run: Slurm kills and requeues the job, which resumes on n1+n2."""
    ref = short_reference(ctx)
    d = fresh(os.path.join(ctx.work, "node-failure"))
    cfg = os.path.join(d, "config.toml")
    ckpt = os.path.join(d, "ckpt")  # passed as CKPT_DIR (the script adds --checkpoint.dir)
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data)
    job, log = submit(ctx, "node-failure", cfg, ckpt_dir=ckpt)
    downed = False
    try:
        wait_first_checkpoint(ctx, job, ckpt)
        ctx.sh("scontrol", "update", "nodename=n2", "state=down", "reason=strata-test")
        downed = True
        print("n2 set DOWN", flush=True)
        # Wait for Slurm's requeue, then bring n2 back so the job again gets 2 nodes.
        t0 = time.time()
        while True:
            info = job_info(ctx, job)
            expect(info is not None, f"job {job} vanished after n2 went down")
            if int(info.get("Restarts", "0")) >= 1 and info.get("JobState") == "PENDING":
                break
            expect(info.get("JobState") not in TERMINAL,
                   f"job ended {info.get('JobState')} when n2 went down instead of being requeued")
            expect(time.time() - t0 < 60, f"job not requeued 60 s after n2 went down ({info.get('JobState')})")
            time.sleep(0.25)
        bring_back_n2(ctx)
        downed = False
        print(f"job {job} requeued by Slurm; n2 is back", flush=True)
        info = wait_job(ctx, job, timeout=300)
    finally:
        if downed:
            bring_back_n2(ctx, check=False)
    expect_completed_after_resume(info, log)
    expect(int(info.get("Restarts", "0")) == 1, f"expected exactly 1 restart, got {info.get('Restarts')}")
    expect_bitwise(os.path.join(d, "out", "model.h5"), ref)


def scenario_preempt_signal(ctx):
    """USR1 to the batch shell (pre-emption warning): checkpoint, exit 75, the script requeues."""
    ref = short_reference(ctx)
    d = fresh(os.path.join(ctx.work, "preempt-signal"))
    cfg = os.path.join(d, "config.toml")
    # A checkpoint every 5 steps: the first comes early and the writes stretch the run (the
    # same results), so that the signal, which a loaded machine may take a second or more to
    # deliver, reaches strata before its last step (a fast run once ended first in CI).
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data, every=5, keep_last=2)
    ckpt = os.path.join(d, "out", "checkpoints")  # no CKPT_DIR: the script reads it from the config
    job, log = submit(ctx, "preempt-signal", cfg)
    wait_first_checkpoint(ctx, job, ckpt)
    ctx.sh("scancel", "--signal=USR1", "--batch", job)
    print(f"sent USR1 to job {job}'s batch shell", flush=True)
    info = wait_job(ctx, job, timeout=300)
    text, _ = expect_completed_after_resume(info, log)
    first = "\n".join(attempts(text)[0])
    expect("got SIGUSR1" in first, "the script did not log receiving SIGUSR1")
    expect("strata exited with 75" in first, "the first attempt did not end with exit 75")
    expect("requeueing" in first, "the script did not requeue after exit 75")
    expect(re.search(r"^stopped after step \d+ .*SIGUSR1.*exit 75", text, re.M),
           "strata did not log 'stopped after step N for a stop signal (SIGUSR1) ... exit 75'")
    expect(int(info.get("Restarts", "0")) == 1, f"expected exactly 1 restart, got {info.get('Restarts')}")
    expect_bitwise(os.path.join(d, "out", "model.h5"), ref)


def scenario_time_limit(ctx):
    """--time=1: strata reads the job's end time, stops with a checkpoint before it (exit 75)."""
    # The first attempt runs until strata stops itself ~10 s before the 1-minute limit, however
    # fast this machine is: max_steps is out of reach. While the requeued job waits, the test
    # sets max_steps a little beyond the step it stopped at (extending a run is allowed: with
    # the constant LR schedule max_steps only says when to stop), so the second attempt is
    # short and the uninterrupted reference costs no more than the job did.
    d = fresh(os.path.join(ctx.work, "time-limit"))
    cfg = os.path.join(d, "config.toml")
    out = os.path.join(d, "out")
    write_config(cfg, out, 900000, ctx.data, every=5000)
    # --signal=B:USR1@0: no warning signal from Slurm, so the stop must be strata's own doing.
    job, log = submit(ctx, "time-limit", cfg, sbatch_args=["--time=1", "--signal=B:USR1@0"])
    t0 = time.time()
    while True:
        info = job_info(ctx, job)
        expect(info is not None, f"job {job} vanished")
        state = info.get("JobState")
        if int(info.get("Restarts", "0")) >= 1 and state == "PENDING":
            break
        expect(state not in TERMINAL, f"job ended {state} ({info.get('ExitCode')}) instead of "
               "stopping itself before its time limit and being requeued")
        expect(time.time() - t0 < 180, f"job still {state} 180 s after submission")
        time.sleep(0.5)
    stop = latest_step(os.path.join(out, "checkpoints"))
    expect(stop > 0, f"no checkpoint after the first attempt (latest step {stop})")
    steps = stop + 300
    STEPS_OF[0] = steps
    write_config(cfg, out, steps, ctx.data, every=5000)
    print(f"attempt 0 stopped itself at step {stop} after {time.time() - t0:.0f} s; "
          f"the run now ends at step {steps}", flush=True)
    info = wait_job(ctx, job, timeout=300)
    text, resumed = expect_completed_after_resume(info, log)
    first = "\n".join(attempts(text)[0])
    expect("got SIG" not in first, "the first attempt received a signal; the stop was not strata's own")
    expect("strata exited with 75" in first, "the first attempt did not end with exit 75")
    expect(re.search(rf"^stopped after step {stop} .*time limit.*exit 75", text, re.M),
           f"strata did not log 'stopped after step {stop} for the job's time limit ... exit 75'")
    expect(int(resumed[0][1]) == stop, f"resumed at step {resumed[0][1]}, the first attempt stopped at {stop}")
    expect(int(info.get("Restarts", "0")) == 1, f"expected exactly 1 restart, got {info.get('Restarts')}")
    ref = reference(ctx, "time-limit", steps)
    expect_bitwise(os.path.join(out, "model.h5"), ref)


def stub_job(ctx, stub, mode, exit_code, sbatch_args=(), timeout=120):
    """A job of the stub in STUB_EXIT=`mode` (its checkpoint directory for the watchdog's
    report), one launch (STRATA_MAX_NO_PROGRESS=1); expects FAILED with `exit_code`."""
    d = fresh(os.path.join(ctx.work, mode))
    cfg = os.path.join(d, "config.toml")
    ckpt = os.path.join(d, "ckpt")
    os.makedirs(ckpt)
    write_config(cfg, os.path.join(d, "out"), 200, ctx.data)
    job, log = submit(ctx, mode, cfg, ckpt_dir=ckpt, strata=stub, sbatch_args=sbatch_args,
                      extra_env={"STUB_EXIT": mode, "STUB_CKPT_DIR": ckpt, "STRATA_MAX_NO_PROGRESS": "1"})
    info = wait_job(ctx, job, timeout=timeout)
    expect(info.get("JobState") == "FAILED" and info.get("ExitCode") == exit_code,
           f"{mode}: job ended {info.get('JobState')} {info.get('ExitCode')}, expected FAILED {exit_code}")
    return info, read(log)


def scenario_no_requeue(ctx):
    """Jobs that cannot succeed end FAILED instead of requeueing forever."""
    # (1) bad input: the data file is missing -> exit 2, no requeue.
    d = fresh(os.path.join(ctx.work, "bad-input"))
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), 200, os.path.join(d, "no-such-data.h5"))
    job, log = submit(ctx, "bad-input", cfg)
    info = wait_job(ctx, job, timeout=120)
    text = read(log)
    expect(info.get("JobState") == "FAILED" and info.get("ExitCode") == "2:0",
           f"bad input: job ended {info.get('JobState')} {info.get('ExitCode')}, expected FAILED 2:0")
    expect(info.get("Restarts") == "0", f"bad input: job was restarted {info.get('Restarts')} times")
    expect("bad input" in text and "not requeueing" in text, "bad input: the script did not say it stops")
    print("bad input: FAILED with exit 2, not requeued", flush=True)

    # (2) checkpoints exist but none verifies -> exit 4, no requeue.
    d = fresh(os.path.join(ctx.work, "bad-checkpoint"))
    cfg = os.path.join(d, "config.toml")
    ckpt = os.path.join(d, "ckpt")
    os.makedirs(ckpt)
    for step in (100, 200):
        with open(os.path.join(ckpt, f"ckpt-{step:09d}.h5"), "wb") as f:
            f.write(b"\x89HDF\r\n\x1a\n" + b"\0garbage" * 64)
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write("ckpt-000000200.h5\n")
    write_config(cfg, os.path.join(d, "out"), 200, ctx.data)
    job, log = submit(ctx, "bad-checkpoint", cfg, ckpt_dir=ckpt)
    info = wait_job(ctx, job, timeout=120)
    text = read(log)
    expect(info.get("JobState") == "FAILED" and info.get("ExitCode") == "4:0",
           f"bad checkpoint: job ended {info.get('JobState')} {info.get('ExitCode')}, expected FAILED 4:0")
    expect(info.get("Restarts") == "0", f"bad checkpoint: job was restarted {info.get('Restarts')} times")
    expect("no usable checkpoint" in text and "not requeueing" in text,
           "bad checkpoint: the script did not say it stops")
    print("bad checkpoint: FAILED with exit 4, not requeued", flush=True)

    # (3) every attempt stops 'resumably' (75) without a new checkpoint: the script requeues
    # until the default limit of 3 attempts without progress, then stops.
    stub = os.path.join(ctx.here, "stub_strata.sh")
    d = fresh(os.path.join(ctx.work, "no-progress"))
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), 200, ctx.data)
    job, log = submit(ctx, "no-progress", cfg, ckpt_dir=os.path.join(d, "ckpt"), strata=stub,
                      extra_env={"STUB_EXIT": "75"})
    info = wait_job(ctx, job, timeout=180)
    text = read(log)
    expect(info.get("JobState") == "FAILED" and info.get("ExitCode") == "75:0",
           f"no progress: job ended {info.get('JobState')} {info.get('ExitCode')}, expected FAILED 75:0")
    expect(info.get("Restarts") == "2", f"no progress: expected 2 restarts (3 attempts), got {info.get('Restarts')}")
    expect("not requeueing: 3 attempts in a row made no progress" in text,
           "no progress: the script did not say it gave up after 3 attempts")
    print("no progress (exit 75 every time): requeued twice, then FAILED", flush=True)

    # (4) Slurm requeues the job (as after a node failure) while it makes no progress: the
    # next attempt sees the count and refuses to run.
    d = fresh(os.path.join(ctx.work, "no-progress-slurm"))
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), 200, ctx.data)
    job, log = submit(ctx, "no-progress-slurm", cfg, ckpt_dir=os.path.join(d, "ckpt"), strata=stub,
                      extra_env={"STUB_EXIT": "sleep", "STRATA_MAX_NO_PROGRESS": "2"})
    requeued = set()

    def requeue_running(info):
        a = int(info.get("Restarts", "0"))
        if info.get("JobState") == "RUNNING" and a not in requeued and \
                f"stub attempt {a} running" in read(log):
            requeued.add(a)
            ctx.sh("scontrol", "requeue", job, check=False)
            print(f"requeued job {job} during attempt {a}", flush=True)

    info = wait_job(ctx, job, timeout=180, on_poll=requeue_running)
    text = read(log)
    expect(info.get("JobState") == "FAILED" and info.get("ExitCode") == "1:0",
           f"Slurm requeues without progress: job ended {info.get('JobState')} {info.get('ExitCode')}, "
           f"expected FAILED 1:0")
    expect(info.get("Restarts") == "2", f"expected 2 restarts, got {info.get('Restarts')}")
    expect("giving up: 2 attempts in a row made no progress" in text,
           "the third attempt did not give up after 2 attempts without progress")
    expect("stub attempt 2 running" not in text, "the third attempt ran strata anyway")
    print("no progress (requeued by Slurm): the third attempt gave up without running", flush=True)


    # (5) a rank exits with an error; while the script waits for the others to follow, a
    # short heartbeat timeout makes rank 0's watchdog name the gone rank: not a hang, so no
    # node is left out and the exit code is the failed rank's.
    info, text = stub_job(ctx, stub, "late-report", "1:0")
    expect("not a hang, no node left out" in text, "late-report: the script did not set the report aside")
    expect("leaving it out" not in text and "taking exit 5" not in text,
           "late-report: the gone rank's node was left out or its exit taken for a hang")
    print("late watchdog report after a failed rank: no node left out, exit 1", flush=True)

    # (5b) a real hang as srun may report it: the watchdog's report is written first, then its
    # MPI_Abort kills the hung rank, whose "Killed" srun can print before the watchdog rank's
    # exit 5. The report came first, so it stands: the hung rank's node is left out, exit 5.
    info, text = stub_job(ctx, stub, "abort-order", "5:0")
    expect("not a hang" not in text, "abort-order: the script set a hang's report aside")
    expect("taking exit 5" in text or "strata exited with 5" in text,
           "abort-order: the watchdog's exit 5 was not taken")
    print("watchdog report before the hung rank's kill: taken as a hang, exit 5", flush=True)

    # (5c) two tasks per node, both of the first node's exit 1: srun names them together
    # ("tasks 0-1: Exited with exit code 1"); the script still kills the rest of the step (the
    # other node's tasks would wait forever) and takes exit 1.
    info, text = stub_job(ctx, stub, "node-fails", "1:0", sbatch_args=("--ntasks-per-node=2",), timeout=60)
    expect("tasks 0-1: Exited with exit code 1" in text and "a rank failed: killing the rest of step" in text,
           "node-fails: srun's 'tasks 0-1' line was not seen, or the rest of the step was not killed")
    print("two tasks of a node failed together: the rest of the step killed, exit 1", flush=True)

    # (6) scancel: strata checkpoints and exits 75 on the TERM, but a cancelled job stays
    # cancelled (the script must not requeue it).
    d = fresh(os.path.join(ctx.work, "cancelled"))
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data)
    job, log = submit(ctx, "cancelled", cfg)
    wait_first_checkpoint(ctx, job, os.path.join(d, "out", "checkpoints"))
    ctx.sh("scancel", job)
    info = wait_job(ctx, job, timeout=120, release=False)
    time.sleep(3)  # a requeue by the script would show up by now
    again = job_info(ctx, job) or info
    text = read(log)
    expect(again.get("JobState") == "CANCELLED" and again.get("Restarts") == "0",
           f"scancel: job is {again.get('JobState')} after {again.get('Restarts')} restarts, "
           "expected CANCELLED without restart")
    expect("attempt 1" not in text, "scancel: the job ran again")
    print("scancel: the job stays CANCELLED", flush=True)


def scenario_inherited_end_time(ctx):
    """An end time inherited from the submitting shell (an hour ago) is not this job's: the
    script takes the job's own from squeue, and the job completes without a restart (it used to
    stop after one step with exit 75 at every attempt and requeue for ever)."""
    d = fresh(os.path.join(ctx.work, "inherited-end-time"))
    cfg = os.path.join(d, "config.toml")
    out = os.path.join(d, "out")
    write_config(cfg, out, 300, ctx.data)
    past = int(time.time()) - 3600
    job, log = submit(ctx, "inherited-end-time", cfg, extra_env={"STRATA_JOB_END_TIME": str(past)})
    info = wait_job(ctx, job, timeout=240, release=False)
    text = read(log)
    expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
           f"job ended {info.get('JobState')} {info.get('ExitCode')}, expected COMPLETED 0:0")
    expect(info.get("Restarts") == "0", f"job was restarted {info.get('Restarts')} times, expected 0")
    expect(f"ignoring the inherited STRATA_JOB_END_TIME={past}" in text,
           "the script did not say it ignores the inherited end time")
    expect(latest_step(os.path.join(out, "checkpoints")) == 300,
           "the run did not reach its last step (300)")
    print("inherited end time an hour ago: ignored, the job completed without a restart", flush=True)


# ---------------------------------------------------------------------------------------------
# Restarts inside the allocation (issue 17)
def rank_process(job, rank, timeout=30):
    """(pid, Slurm node) of the strata process of rank RANK of job JOB, waiting for it."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        found = find_rank_process(job, rank)
        if found:
            return found
        time.sleep(0.1)
    fail(f"no strata process of rank {rank} of job {job} found")


def launches(log):
    """The script's lines per launch of attempt 0: {launch: [lines]}."""
    out = {}
    for line in log.splitlines():
        m = re.match(r"train\.sbatch: \[job \d+ attempt 0 launch (\d+) ", line)
        if m:
            out.setdefault(int(m.group(1)), []).append(line)
    return out


def checkpoint_attrs(ckpt_dir):
    """slurm_job_id and slurm_restart_count of the newest checkpoint."""
    with open(os.path.join(ckpt_dir, "latest")) as f:
        name = f.readline().strip()
    with h5py.File(os.path.join(ckpt_dir, name), "r") as f:
        job = f.attrs["slurm_job_id"]
        job = job.decode() if isinstance(job, bytes) else str(job)
        return job, int(f.attrs["slurm_restart_count"])


def scenario_restart_killed(ctx):
    """SIGKILL of one rank: the script restarts strata inside the same allocation (no requeue,
    SLURM_RESTART_COUNT stays 0) and the job ends bitwise identical to an uninterrupted run."""
    ref = short_reference(ctx)
    d = fresh(os.path.join(ctx.work, "restart-killed"))
    cfg = os.path.join(d, "config.toml")
    ckpt = os.path.join(d, "ckpt")
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data)
    job, log = submit(ctx, "restart-killed", cfg, ckpt_dir=ckpt)
    wait_first_checkpoint(ctx, job, ckpt)
    pid, node = rank_process(job, 1)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    print(f"killed rank 1 (pid {pid} on {node})", flush=True)
    info = wait_job(ctx, job, timeout=300, release=False)
    text = read(log)
    expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
           f"job ended {info.get('JobState')} {info.get('ExitCode')}, expected COMPLETED 0:0")
    expect(info.get("Restarts") == "0", f"the job was requeued ({info.get('Restarts')} restarts)")
    expect("attempt 1" not in text, "the log shows a second Slurm attempt")
    ln = launches(text)
    expect(sorted(ln) == [0, 1], f"expected launches 0 and 1 of attempt 0, the log shows {sorted(ln)}")
    first = "\n".join(ln[0])
    expect("a rank was killed" in first and "restarting in the allocation" in first,
           "the script did not log restarting in the allocation after the killed rank")
    expect("leaving it out" not in text, "a killed rank's node was left out (it was not hung)")
    resumed = re.findall(r"resumed from (\S+) at step (\d+)", text)
    expect(len(resumed) == 1 and 0 < int(resumed[0][1]) < STEPS, f"expected one resume inside the run: {resumed}")
    m = re.search(r"\[job \d+ attempt 0 launch 1 (\S+ \S+)\] newest checkpoint", text)
    expect(m, "no 'newest checkpoint' line for launch 1")
    import datetime
    started = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
    print(f"launch 1 began {started - killed_at:.1f} s after the kill", flush=True)
    expect(re.search(r"^goodput .*; 1 restart\)$", text, re.M), "the end-of-run line does not count 1 restart")
    job_attr, restart_attr = checkpoint_attrs(ckpt)
    expect(job_attr == job and restart_attr == 0,
           f"the last checkpoint says job {job_attr}, SLURM_RESTART_COUNT {restart_attr}; expected {job}, 0")
    expect_bitwise(os.path.join(d, "out", "model.h5"), ref)


def losses_by_step(path):
    """Loss by step from a metrics file (a later line wins: a resumed run repeats steps)."""
    import json
    out = {}
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            if "event" not in m:
                out[int(m["step"])] = float(m["loss"])
    return out


def final_metrics(path):
    import json
    with open(path) as f:
        done = [json.loads(l) for l in f if '"done"' in l]
    expect(done, f"no done event in {path}")
    return done[-1]


def scenario_hang_exclude(ctx):
    """SIGSTOP of one rank: strata's watchdog names it (exit 5, checkpoint.dir/hung-rank), the
    script leaves its node out and the job finishes on the other node, in the same allocation."""
    ref = short_reference(ctx)
    d = fresh(os.path.join(ctx.work, "hang-exclude"))
    cfg = os.path.join(d, "config.toml")
    ckpt = os.path.join(d, "ckpt")
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data, extra="[watchdog]\ntimeout_s = 3\n",
                 log_every=10, keep_last=1000)  # every checkpoint kept: the resumed one is replayed
    job, log = submit(ctx, "hang-exclude", cfg, ckpt_dir=ckpt)
    wait_first_checkpoint(ctx, job, ckpt)
    pid, node = rank_process(job, 1)
    os.kill(pid, signal.SIGSTOP)
    print(f"stopped rank 1 (pid {pid} on {node})", flush=True)
    try:
        info = wait_job(ctx, job, timeout=300, release=False)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)  # if the job left it behind
            stopped_left = True
        except ProcessLookupError:
            stopped_left = False
    text = read(log)
    expect(not stopped_left, f"the stopped rank (pid {pid}) outlived the job")
    expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
           f"job ended {info.get('JobState')} {info.get('ExitCode')}, expected COMPLETED 0:0")
    expect(info.get("Restarts") == "0", f"the job was requeued ({info.get('Restarts')} restarts)")
    expect(re.search(rf"strata: error: watchdog: rank 1 \(host \S+, node {node}\) made no progress", text),
           f"the watchdog did not name rank 1 on node {node}")
    ln = launches(text)
    expect(sorted(ln) == [0, 1], f"expected launches 0 and 1 of attempt 0, the log shows {sorted(ln)}")
    first = "\n".join(ln[0])
    expect(f"hung rank on node {node}" in first and "leaving it out" in first,
           f"the script did not leave out node {node}")
    other = "n1" if node == "n2" else "n2"
    expect(f"health check: 1 node(s) ok ({other})" in first, f"the health check did not keep only {other}")
    expect("launching on 1 node(s), 1 task(s) (excluded: " + node + ")" in first,
           "launch 1 was not on the one node left")
    expect("restarting in the allocation" in first, "the script did not restart in the allocation")
    # 2 ranks, then 1: not bitwise against the 2-rank run (the gradient sums round differently),
    # and over hundreds of steps not even close: a 1e-7 difference that moves one sample's
    # pre-activation across a ReLU's kink changes that step's gradient by O(1) (seen: 2.9e-7,
    # then 1.5e-3 relative at one step, 92 steps after a resume at step 500). So: the first
    # logged step after the resume follows the 2-rank run to rounding (a wrong data position
    # or parameter would be off by far more), and the rest of the job is bitwise what one rank
    # resumed from the same checkpoint outside Slurm computes.
    done = final_metrics(os.path.join(d, "out", "metrics.jsonl"))
    expect(done["step"] == STEPS, f"the job ended at step {done['step']}, not {STEPS}")
    at = int(re.findall(r"resumed from \S+ at step (\d+)", text)[-1])
    mine, theirs = losses_by_step(os.path.join(d, "out", "metrics.jsonl")), \
        losses_by_step(os.path.join(os.path.dirname(ref), "metrics.jsonl"))
    first = at + 10
    expect(first in mine and first in theirs, f"step {first} (10 after the resume) was not logged")
    rel = abs(mine[first] - theirs[first]) / abs(theirs[first])
    expect(rel < 1e-5, f"10 steps after the resume on 1 rank at step {at} the loss differs from "
           f"the uninterrupted 2-rank run by {rel:.2e} (relative)")
    resumed_from = os.path.join(ckpt, f"ckpt-{at:09d}.h5")
    replay = os.path.join(d, "replay")
    p = subprocess.run([ctx.strata, "train", "--config", cfg, "--output.dir", replay,
                        "--checkpoint.dir", os.path.join(replay, "ckpt"), "--resume", resumed_from,
                        "--quiet"], env=ctx.env, capture_output=True, text=True, timeout=300)
    expect(p.returncode == 0, f"one rank resumed from {resumed_from} outside Slurm failed: {p.stderr}")
    expect_bitwise(os.path.join(d, "out", "model.h5"), os.path.join(replay, "model.h5"),
                   f"one rank resumed from step {at} outside Slurm")
    print(f"finished on {other} alone: step {first} within {rel:.1e} of the uninterrupted 2-rank "
          f"run; the final parameters bitwise those of one rank resumed from step {at}", flush=True)


def scenario_restart_loop(ctx):
    """A launch that fails at once, every time: the no-progress guard ends the restarts."""
    stub = os.path.join(ctx.here, "stub_strata.sh")
    d = fresh(os.path.join(ctx.work, "restart-loop"))
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), 200, ctx.data)
    job, log = submit(ctx, "restart-loop", cfg, ckpt_dir=os.path.join(d, "ckpt"), strata=stub,
                      extra_env={"STUB_EXIT": "1"})
    info = wait_job(ctx, job, timeout=180, release=False)
    text = read(log)
    expect(info.get("JobState") == "FAILED" and info.get("ExitCode") == "1:0",
           f"job ended {info.get('JobState')} {info.get('ExitCode')}, expected FAILED 1:0")
    expect(info.get("Restarts") == "0", f"the job was requeued ({info.get('Restarts')} restarts)")
    ln = launches(text)
    expect(sorted(ln) == [0, 1, 2], f"expected launches 0, 1, 2 (the guard's 3), the log shows {sorted(ln)}")
    expect(text.count("restarting in the allocation") == 2, "expected 2 restarts in the allocation")
    expect("not restarting: 3 launches in a row made no progress" in text,
           "the script did not say it stops restarting after 3 launches without progress")
    print("exit 1 at every launch: restarted twice in the allocation, then FAILED", flush=True)


SCENARIOS = {
    "restart-killed": scenario_restart_killed,
    "hang-exclude": scenario_hang_exclude,
    "restart-loop": scenario_restart_loop,
    "reference": scenario_reference,
    "node-failure": scenario_node_failure,
    "preempt-signal": scenario_preempt_signal,
    "time-limit": scenario_time_limit,
    "no-requeue": scenario_no_requeue,
    "inherited-end-time": scenario_inherited_end_time,
}


def main(scenarios=None):
    """Runs the scenario the command line names, of `scenarios` (these by default)."""
    scenarios = scenarios or SCENARIOS
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=sorted(scenarios))
    ap.add_argument("--strata", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--sbatch", required=True)
    ap.add_argument("--cluster", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    t0 = time.time()
    ctx = None
    try:
        ctx = Ctx(a)
        scenarios[a.scenario](ctx)
    except (Failure, subprocess.TimeoutExpired, OSError) as e:
        print(f"FAIL ({a.scenario}): {e}", flush=True)
        for job, log in (ctx.logs if ctx else []):
            print(f"\n----- log of job {job}: {log} -----\n{read(log) or '(empty or missing)'}")
        if ctx:
            ctld = os.path.join(os.path.abspath(a.cluster), "log", "slurmctld.log")
            tail = read(ctld).splitlines()[-40:]
            print(f"\n----- last lines of {ctld} -----\n" + "\n".join(tail))
        sys.exit(1)
    print(f"PASS ({a.scenario}) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
