"""Memory checkpoints on the local two-node Slurm cluster (issue 33), short runs (600 steps).

    memory_jobs.py SCENARIO --strata BIN --data FILE --work DIR --sbatch FILE --cluster DIR

SCENARIO:
  restart   slurm/train.sbatch, checkpoint.memory_every = 1, rank 1 killed (SIGKILL) after step
            250: the restart in the allocation resumes from memory at step 250; bitwise equal
            to the uninterrupted run; no memory directory left once the job completed
  copies    one job, four launches: every own copy of rank 1's part damaged (a flipped byte:
            skipped and said so, the other copy taken); node n1's directory deleted (a lost
            node: rank 0's part from the copy on n2); every copy of rank 1's part deleted (the
            checkpoint file at step 300); bitwise at the end. Twice: data-parallel replicas
            (each the other's copy, no partner exchange; one generation the optimizer's
            update writes in place, with lane sums) and ZeRO-1 (the partner's copies; two
            generations of copies, with CRC-32C)
  parallel  ZeRO-2 and a 2-stage pipeline through train.sbatch, a rank killed: resumed from
            memory, bitwise equal to their uninterrupted runs
  cleanup   a job that fails and one that is cancelled leave no memory directory on any node

The fault is STRATA_TEST_KILL_AT_STEP=STEP:RANK (that rank kills itself with SIGKILL once the
memory checkpoint after STEP steps is complete), so each restore's step is known exactly.
"""
import glob
import os
import re
import subprocess
import time

from slurm_jobs import (Failure, expect, expect_bitwise, fresh, launches, read, submit, wait_job,
                        write_config)
from slurm_jobs import main as slurm_main

STEPS = 600
KILL = 250


def config(ctx, d, extra="", every=100, memory_dir=None):
    cfg = os.path.join(d, "config.toml")
    mem = "" if memory_dir is None else f'memory_dir = "{memory_dir}"\n'
    # write_config's [checkpoint] table is the last before [output]: append to it by extra.
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data, every=every)
    text = read(cfg).replace("[output]", f"memory_every = 1\n{mem}[output]") + extra
    with open(cfg, "w") as f:
        f.write(text)
    return cfg


def reference(ctx, name, extra=""):
    """The uninterrupted 2-rank run (mpirun, no memory checkpoints) with `extra` config."""
    d = fresh(os.path.join(ctx.work, f"memref-{name}"))
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), STEPS, ctx.data)
    with open(cfg, "a") as f:
        f.write(extra)
    env = {k: v for k, v in ctx.env.items() if not k.startswith("OMPI_MCA_btl")}
    p = subprocess.run(["mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none", ctx.strata,
                        "train", "--config", cfg, "--progress", "off"],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise Failure(f"reference {name} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return os.path.join(d, "out", "model.h5")


def completed(info):
    expect(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
           f"job ended {info.get('JobState')} {info.get('ExitCode')}, expected COMPLETED 0:0")
    expect(info.get("Restarts") == "0", "the job was requeued")


def no_memory_dir(path, what, wait_s=10):
    t0 = time.time()
    while time.time() - t0 < wait_s:
        left = [p for p in glob.glob(path)]
        if not left:
            print(f"no memory directory left after {what} ({path})", flush=True)
            return
        time.sleep(0.25)
    fail_left = sorted(glob.glob(path + "/**", recursive=True))[:10]
    raise Failure(f"memory directories left after {what}: {fail_left}")


def restart_job(ctx, name, extra=""):
    """train.sbatch with rank 1 killed after step KILL; returns (job log text, job id)."""
    d = fresh(os.path.join(ctx.work, f"mem-{name}"))
    cfg = config(ctx, d, extra)
    job, log = submit(ctx, f"mem-{name}", cfg, ckpt_dir=os.path.join(d, "ckpt"),
                      extra_env={"STRATA_TEST_KILL_AT_STEP": f"{KILL}:1"})
    completed(wait_job(ctx, job, timeout=300, release=False))
    text = read(log)
    expect(sorted(launches(text)) == [0, 1], f"expected launches 0 and 1, the log shows {sorted(launches(text))}")
    m = re.findall(r"^resumed from memory at step (\d+): (.*)$", text, re.M)
    # Rank 0 is killed by the script a moment after rank 1: its own copy of step KILL is
    # normally written by then, else its partner's copy (on n2) is taken.
    expect(len(m) == 1 and m[0][0] == str(KILL), f"expected one 'resumed from memory at step {KILL}': {m}")
    print(f"resumed from memory at step {m[0][0]}: {m[0][1]}", flush=True)
    expect(re.search(r"^goodput .*1 restart: 1 from memory, 0 from files\)$", text, re.M),
           "the end-of-run line does not count 1 restart from memory")
    expect_bitwise(os.path.join(d, "out", "model.h5"), reference(ctx, name, extra))
    return text, job


def scenario_restart(ctx):
    text, job = restart_job(ctx, "restart")
    expect("removed the memory checkpoints" in text, "the script did not remove the memory directories")
    no_memory_dir(f"/dev/shm/strata-{job}", "the job completed")


def scenario_parallel(ctx):
    restart_job(ctx, "zero2", "[parallel]\nzero = 2\n")
    restart_job(ctx, "pipeline", "[parallel]\npipeline_stages = 2\n")


COPIES_SCRIPT = r"""#!/bin/bash
# Four launches of one job; between them the test's damage to the memory directories.
set -u
run() {
  echo "== launch (STRATA_TEST_KILL_AT_STEP=$1)"
  STRATA_TEST_KILL_AT_STEP=$1 srun --mpi=pmix --kill-on-bad-exit=1 "$STRATA" train \
    --config "$CONFIG" --resume auto --progress off
  echo "== launch exit $?"
}
flip() { printf '\x5a' | dd of="$1" bs=1 seek=500 conv=notrunc status=none; echo "== flipped a byte of $1"; }
run 250:1
echo "== files after launch 1: $(cd "$MEM" && ls n1 n2 | tr '\n' ' ')"
for f in "$MEM"/n2/part-00001-*.own; do flip "$f"; done
run 300:1
rm -rf "$MEM"/n1; echo "== removed $MEM/n1"
run 350:0
for g in $GONE; do rm -f "$MEM"/n1/$g "$MEM"/n2/$g; done; echo "== removed every copy of part 1"
run -1:-1
"""


def copies_job(ctx, name, extra, gone, other, lacking, own_copies):
    """COPIES_SCRIPT with `extra` config; `gone`: the files that hold part 1's copies; `other`:
    the start of the restore line's words for a part taken from another rank's copy;
    `lacking`: why the last launch cannot resume from memory; `own_copies`: rank 1's own
    copies on its node (generations: 1 written in place, 2 alternating), each flipped."""
    d = fresh(os.path.join(ctx.work, f"mem-{name}"))
    mem = os.path.join(d, "mem")
    cfg = config(ctx, d, extra, memory_dir=mem + "/%n")
    script = os.path.join(d, "job.sh")
    with open(script, "w") as f:
        f.write(COPIES_SCRIPT)
    log = os.path.join(d, "job.log")
    env = dict(ctx.env, CONFIG=cfg, STRATA=ctx.strata, MEM=mem, GONE=gone)
    p = ctx.sh("sbatch", "--parsable", f"--job-name=t-mem-{name}", "--nodes=2", "--ntasks-per-node=1",
               "--cpus-per-task=1", "--time=5", f"--output={log}", f"--chdir={d}", script, env=env)
    job = p.stdout.strip().split(";")[0]
    ctx.logs.append((job, log))
    wait_job(ctx, job, timeout=300, release=False)
    text = read(log)
    exits = re.findall(r"^== launch exit (\d+)$", text, re.M)
    expect(len(exits) == 4 and exits[3] == "0", f"expected 4 launches, the last exiting 0: {exits}")
    # (lane sums: a generation the optimizer's update wrote; CRC-32C: a copy)
    damaged = re.findall(r"memory checkpoint \S+/n2/part-00001-(?:\d+|gen\d)\.own is damaged \((?:CRC-32C|lane sums)", text)
    expect(len(damaged) == own_copies,
           f"expected the {own_copies} damaged own copies of part 1 named: {damaged}")
    resumed = re.findall(r"^resumed from memory at step (\d+): (.*)$", text, re.M)
    expect(len(resumed) == 2, f"expected 2 resumes from memory: {resumed}")
    step, how = resumed[0]
    # The other copy of the killed rank's last save is written as soon as it can be (the
    # partner's arrives on the exchange thread), unless the kill of the job's other rank cut
    # it short.
    expect(KILL - 3 <= int(step) <= KILL and how.startswith(other),
           f"after the flipped bytes: {resumed[0]} (expected {KILL} or just before, '{other}')")
    expect(resumed[1][0] == "300" and resumed[1][1].startswith(other),
           f"after n1's directory was removed: {resumed[1]} (expected step 300, '{other}')")
    expect(re.search(r"^resuming from the checkpoint files, not from memory: " + re.escape(lacking), text, re.M),
           f"after every copy of part 1 was removed: no 'resuming from the checkpoint files, not from "
           f"memory: {lacking}' line")
    # The newest checkpoint file: step 300's unless the kill after step 300 cut its
    # background write short (then step 200's).
    f = re.findall(r"^resumed from \S+ckpt-0*(\d+)\.h5 at step (\d+)", text, re.M)
    expect(len(f) == 1 and f[0][0] in ("200", "300"),
           f"after every copy of part 1 was removed: expected a resume from the checkpoint file at step 300 (or 200): {f}")
    print(f"{name}: every copy of part 1 gone: resumed from the checkpoint file at step {f[0][1]}", flush=True)
    expect_bitwise(os.path.join(d, "out", "model.h5"), reference(ctx, name, extra))
    for step_, how_ in resumed:
        print(f"{name}: resumed from memory at step {step_}: {how_}", flush=True)
    return text


def scenario_copies(ctx):
    # Data-parallel replicas (no ZeRO) hold the same part: each node's own copies are the
    # other's second copy, no partner exchange; every copy of part 1 is then every part file.
    # The update writes their one generation in place (each replica's copy stands in for the
    # other's update cut short).
    text = copies_job(ctx, "copies", "", "part-*", "1 part(s) from a data-parallel replica's copy",
                      "no memory copies", own_copies=1)
    expect("whose own copies are its second copy: no partner copies" in text,
           "the replicas' run did not say it keeps no partner copies")
    expect("the optimizer's update writes each generation" in text and "is damaged (lane sums" in text,
           "the replicas' run: its generations were not written by the update (lane sums)")
    files = re.findall(r"^== files after launch 1: (.*)$", text, re.M)
    one_each = ["n1:", "part-00000-gen0.own", "n2:", "part-00001-gen0.own"]
    expect(len(files) == 1 and files[0].split() == one_each,
           f"the replicas' run: expected one own generation per rank and no partner's (.peer) "
           f"after launch 1: {files}")
    expect("in place in one generation" in text, "the replicas' run did not say it writes in place")
    # ZeRO-1 shards the optimizer state, so each rank's part is its own: the partner's copies.
    text = copies_job(ctx, "copies-zero1", "[parallel]\nzero = 1\n", "part-00001-*",
                      "1 part(s) from the partner's copy", "step 350 lacks part 1", own_copies=2)
    files = re.findall(r"^== files after launch 1: (.*)$", text, re.M)
    expect(len(files) == 1 and ".peer" in files[0], f"the ZeRO-1 run: no partner's copy (.peer) after launch 1: {files}")
    expect("the optimizer's update writes each generation" not in text and "is damaged (CRC-32C" in text,
           "the ZeRO-1 run (a sharded optimizer): its saves were not copies")


def scenario_cleanup(ctx):
    # Fails: no checkpoint files (every_steps = 0), no restarts: the killed launch ends the job.
    d = fresh(os.path.join(ctx.work, "mem-fails"))
    job, log = submit(ctx, "mem-fails", config(ctx, d, every=0), ckpt_dir=os.path.join(d, "ckpt"),
                      extra_env={"STRATA_TEST_KILL_AT_STEP": f"{KILL}:1", "STRATA_MAX_RESTARTS": "0"})
    info = wait_job(ctx, job, timeout=300, release=False)
    expect(info.get("JobState") == "FAILED", f"job ended {info.get('JobState')}, expected FAILED")
    expect(re.search(r"^memory checkpoints: every 1 step into /dev/shm/strata-" + job, read(log), re.M),
           "the failing job did not take memory checkpoints in /dev/shm")
    no_memory_dir(f"/dev/shm/strata-{job}", "the job failed")
    # Cancelled while training.
    d = fresh(os.path.join(ctx.work, "mem-cancelled"))
    cfg = config(ctx, d)
    with open(cfg) as f:
        text = f.read().replace(f"max_steps = {STEPS}", "max_steps = 1000000")
    with open(cfg, "w") as f:
        f.write(text)
    job, log = submit(ctx, "mem-cancelled", cfg, ckpt_dir=os.path.join(d, "ckpt"))
    t0 = time.time()
    while not glob.glob(f"/dev/shm/strata-{job}/part-*") and time.time() - t0 < 120:
        time.sleep(0.25)
    expect(glob.glob(f"/dev/shm/strata-{job}/part-*"), "no memory checkpoint appeared within 120 s")
    ctx.sh("scancel", job)
    info = wait_job(ctx, job, timeout=120, release=False)
    expect(info.get("JobState") == "CANCELLED", f"job ended {info.get('JobState')}, expected CANCELLED")
    no_memory_dir(f"/dev/shm/strata-{job}", "the job was cancelled")


SCENARIOS = {"restart": scenario_restart, "copies": scenario_copies,
             "parallel": scenario_parallel, "cleanup": scenario_cleanup}


if __name__ == "__main__":
    slurm_main(SCENARIOS)
