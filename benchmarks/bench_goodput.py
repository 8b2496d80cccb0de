#!/usr/bin/env python3
"""Goodput under faults on the local two-node Slurm cluster (slurm/local-cluster.sh), issue 17.

  benchmarks/bench_goodput.py [--strata build/strata] [--data data/fashion-mnist.h5]
      [--minutes 12] [--steps N] [--fault-every 100] [--seed 1]
      [--faults kill,kill,kill,stop,down,usr1] [--arms requeue,restart] [--no-release]
      [--heartbeat-timeout 1] [--reference DIR] [--work /var/tmp/strata-bench-goodput]

One training job (configs/fmnist_cnn.toml's CNN, 2 ranks on one node of an allocation of two,
the other a hot spare; checkpoint every 5 s; watchdog timeout 5 s, a stopped rank named after
1 s without heartbeats: --heartbeat-timeout) runs the same number of steps three times (a
probe of the step rate picks it so that training lasts --minutes; --steps sets it): once
uninterrupted (the baseline, and the parameters to compare with; --reference DIR reuses an
earlier one), then once per arm with faults at a fixed rate in wall time, the same seeded
seconds since the job started in both arms, until the job ends (an arm that loses more time
meets more faults, as a real job would):

  requeue   STRATA_MAX_RESTARTS=0: slurm/train.sbatch as before issue 17, every fault requeues
  restart   the default: restarts inside the allocation; a node set DOWN and USR1 still requeue
  memory    as restart, with checkpoint.memory_every = 1 (--memory-every; issue 33): a restart resumes from the
            last step in node memory when the node's copies survived (each simulated node has a
            memory directory of its own: a node left out takes its copies with it); --memory-budget B
            adds checkpoint.memory_budget (the interval set by the saves' measured cost)

Faults (one every --fault-every s ± 30 %, seeded; their kinds cycle through --faults in a
seeded random order; each only after the job wrote a checkpoint since the last fault, else at a
random point of the next checkpoint interval):
  kill   SIGKILL of rank 1's process
  stop   SIGSTOP of rank 1's process (strata's watchdog names it; its node is left out)
  down   `scontrol update nodename=N state=down` of rank 0's node (Slurm kills and requeues
         the job; the node is resumed once the job is pending)
  usr1   `scancel --signal=USR1 --batch` (pre-emption: checkpoint, exit 75, requeue)

A requeued job is eligible again only ~120 s later (Slurm's BeginTime); unless --no-release,
the benchmark releases it with `scontrol update jobid=J StartTime=now` (2 s after the requeue,
once its old steps are gone) and reports, per requeue, how long the queue would have held it.

Reported per arm: goodput (strata's `done` event: useful step time / wall time since the job's
first attempt), time lost per cause, per fault (from goodput.toml's restart records: restart gap
= detection + teardown + queue, start-up, recomputed steps), and whether the final parameters
are bitwise identical to the uninterrupted run. Needs root (the cluster's daemons)."""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "slurm"))
from slurm_procs import find_rank_process, job_processes, parse_job  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist.h5"))
ap.add_argument("--work", default="/var/tmp/strata-bench-goodput")
ap.add_argument("--minutes", type=float, default=12)
ap.add_argument("--fault-every", type=float, default=100)
ap.add_argument("--reference", default="", help="an earlier run's uninterrupted/ directory to reuse")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--faults", default="kill,kill,kill,stop,down,usr1")
ap.add_argument("--arms", default="requeue,restart", help="requeue, restart, memory")
ap.add_argument("--memory-every", type=int, default=1, help="the memory arm's checkpoint.memory_every")
ap.add_argument("--memory-budget", type=float, default=0.0,
                help="the memory arm's checkpoint.memory_budget (0: a fixed interval)")
ap.add_argument("--heartbeat-timeout", type=float, default=1,
                help="watchdog.heartbeat_timeout_s of every arm (a stopped rank's detection)")
ap.add_argument("--no-release", action="store_true")
ap.add_argument("--steps", type=int, default=0, help="skip the speed probe: train this many steps")
a = ap.parse_args()

CLUSTER = "/tmp/strata-slurm-bench"
CONF = os.path.join(CLUSTER, "etc", "slurm.conf")
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "STRATA_"))}
ENV.update(SLURM_CONF=CONF, OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo",
           OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def sh(*cmd, check=True):
    p = subprocess.run(list(cmd), env=ENV, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    return p


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def job_info(job):
    p = sh("scontrol", "-o", "show", "job", job, check=False)
    return parse_job(p.stdout) if p.returncode == 0 else None


def progress(metrics):
    """The newest step the job's metrics.jsonl logged (log_every steps), 0 before any."""
    try:
        with open(metrics) as f:
            steps = [int(m.group(1)) for m in re.finditer(r'^\{"step": (\d+)', f.read(), re.M)]
    except OSError:
        return 0
    return max(steps, default=0)


def latest_step(ckpt):
    try:
        with open(os.path.join(ckpt, "latest")) as f:
            return int(re.search(r"\d+", f.readline()).group(0))
    except (OSError, AttributeError):
        return -1


def write_config(path, out, steps, memory=False):
    with open(os.path.join(ROOT, "configs", "fmnist_cnn.toml")) as f:
        text = f.read()
    text = text.replace('path = "data/fashion-mnist.h5"', f'path = "{os.path.abspath(a.data)}"')
    text = text.replace("epochs = 4", f"epochs = 1000\nmax_steps = {steps}")
    text = text.replace('dir = "runs/fmnist_cnn"', f'dir = "{out}"')
    text += "\n[checkpoint]\nevery_seconds = 5\nkeep_last = 3\n"
    if memory:  # the memory arm: every step into node memory; %n: each node its own (they share a host)
        text += f'memory_every = {a.memory_every}\nmemory_dir = "/dev/shm/strata-bench-memory/%n"\n'
        text += f"memory_budget = {a.memory_budget}\n"
    text += f"[watchdog]\ntimeout_s = 5\nheartbeat_timeout_s = {a.heartbeat_timeout}\n"
    with open(path, "w") as f:
        f.write(text)


def submit(name, steps, env_extra):
    d = os.path.join(a.work, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = os.path.join(d, "config.toml")
    write_config(cfg, os.path.join(d, "out"), steps, memory=name == "memory")
    env = dict(ENV, CONFIG=cfg, STRATA=os.path.abspath(a.strata), STRATA_STEP_NODES="1", **env_extra)
    log = os.path.join(d, "job.log")
    p = subprocess.run(["sbatch", "--parsable", f"--job-name=bench-{name}", "--nodes=2",
                        "--ntasks-per-node=2", "--cpus-per-task=1", "--time=120",
                        f"--output={log}", f"--chdir={d}", os.path.join(ROOT, "slurm", "train.sbatch")],
                       env=env, capture_output=True, text=True, check=True)
    job = p.stdout.strip().split(";")[0]
    say(f"submitted {name}: job {job}")
    return job, d, log


class Requeues:
    """Requeued jobs: the queue's BeginTime, and (unless --no-release) the early release."""

    def __init__(self):
        self.pending_since = self.clean_since = None
        self.records = []

    def poll(self, job, info):
        if info.get("JobState") != "PENDING" or info.get("Reason") != "BeginTime":
            self.pending_since = self.clean_since = None
            return
        now = time.time()
        if self.pending_since is None:
            self.pending_since = now
            eligible = info.get("EligibleTime", "")
            try:
                wait = time.mktime(time.strptime(eligible, "%Y-%m-%dT%H:%M:%S")) - now
            except ValueError:
                wait = float("nan")
            self.records.append({"at": now, "queue_would_hold_s": wait, "released_after_s": None})
            say(f"job {job} requeued: eligible again in {wait:.0f} s (Slurm's BeginTime)")
        if a.no_release or self.records[-1]["released_after_s"] is not None:
            return
        # Only once its old instance has been gone everywhere for 3 s: no step files in the
        # spool, no process of the job (slurmd refuses a second copy of a job it still tracks,
        # "Job N already running", and slurmctld then drains the node: "Duplicate jobid"), and
        # not within 2 s of the requeue (nor a credential issued in the second one was revoked).
        spool = [n for node in ("n1", "n2") for n in os.listdir(os.path.join(CLUSTER, "spool", node))
                 if f"_{job}." in n or f".pmix.{job}." in n]
        if spool or job_processes(job):
            self.clean_since = None
            return
        if self.clean_since is None:
            self.clean_since = now
        if now - self.pending_since >= 2 and now - self.clean_since >= 3:
            sh("scontrol", "update", f"jobid={job}", "StartTime=now", check=False)
            self.records[-1]["released_after_s"] = now - self.pending_since
            say(f"released job {job} with StartTime=now after {now - self.pending_since:.1f} s")


def inject(kind, job, ckpt):
    """One fault; returns a description, or None if the job had no ranks to hit."""
    if kind in ("kill", "stop"):
        found = find_rank_process(job, 1)
        if not found:
            return None
        pid, node = found
        os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
        if kind == "stop":
            STOPPED.append(pid)
        return f"SIG{'KILL' if kind == 'kill' else 'STOP'} of rank 1 (pid {pid}, node {node})"
    if kind == "down":
        found = find_rank_process(job, 0)
        if not found:
            return None
        node = found[1]
        sh("scontrol", "update", f"nodename={node}", "state=down", "reason=bench-goodput")
        DOWNED.append(node)
        return f"node {node} (rank 0's) set DOWN"
    if kind == "usr1":
        sh("scancel", "--signal=USR1", "--batch", job)
        return "USR1 to the batch shell (pre-emption)"
    raise ValueError(kind)


STOPPED, DOWNED = [], []


def bring_back_nodes():
    for node in list(DOWNED):
        sh("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        DOWNED.remove(node)


def run_arm(name, steps, plan, env_extra):
    """Submits the job, injects the planned faults (seconds since the job started), waits."""
    job, d, log = submit(name, steps, env_extra)
    ckpt = os.path.join(d, "out", "checkpoints")
    metrics = os.path.join(d, "out", "metrics.jsonl")
    requeues = Requeues()
    started, injected, last_ckpt, deferred = None, [], -1, False
    delay_rng = random.Random(a.seed + 1)
    todo = list(plan)
    while True:
        info = job_info(job)
        if info is None:
            sys.exit(f"job {job} vanished")
        state = info.get("JobState")
        if state == "RUNNING" and started is None:
            started = time.time()
        requeues.poll(job, info)
        if "held" in info.get("Reason", "").lower():
            sh("scancel", job, check=False)
            sys.exit(f"{name}: job {job} is held ({info.get('Reason')}); see {CLUSTER}/log/slurmctld.log")
        if state == "PENDING" and DOWNED:
            bring_back_nodes()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            time.sleep(1.0)
            again = job_info(job)
            if again is None or again.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                info = again or info
                break
        if todo and started and state == "RUNNING" and time.time() - started >= todo[0][0]:
            step = latest_step(ckpt)
            if step <= last_ckpt:
                deferred = True  # no checkpoint since the last fault yet: wait for progress
            elif deferred:
                # Not right after the checkpoint that ended the wait (that would spare the
                # fault its recomputed steps): somewhere in the next checkpoint interval.
                todo[0] = (time.time() - started + delay_rng.uniform(0, 5), todo[0][1])
                deferred = False
            else:
                what = inject(todo[0][1], job, ckpt)
                if what:
                    injected.append({"kind": todo[0][1], "at_s": time.time() - started,
                                     "planned_s": todo[0][0], "what": what, "newest_checkpoint": step})
                    say(f"fault {len(injected)} at {time.time() - started:.0f} s (step "
                        f"{progress(metrics)}): {what}")
                    last_ckpt = step
                    todo.pop(0)
        time.sleep(0.2)
    bring_back_nodes()
    for pid in STOPPED:  # a stopped rank the job left behind would be a bug: say so
        try:
            os.kill(pid, signal.SIGKILL)
            say(f"WARNING: stopped pid {pid} outlived the job")
        except ProcessLookupError:
            pass
    STOPPED.clear()
    wall = time.time() - started
    load = os.getloadavg()
    say(f"{name}: job {job} {info.get('JobState')} {info.get('ExitCode')}, {info.get('Restarts')} "
        f"requeues, {wall:.0f} s from its start; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} "
        f"(the machine is shared)")
    if info.get("JobState") != "COMPLETED":
        sys.exit(f"{name}: job {job} did not complete; see {log}")
    with open(os.path.join(d, "out", "metrics.jsonl")) as f:
        done = [json.loads(l) for l in f if '"done"' in l][-1]
    with open(os.path.join(ckpt, "goodput.toml"), "rb") as f:
        ledger = tomllib.load(f)
    with open(log) as f:
        text = f.read()
    return {"name": name, "job": job, "dir": d, "done": done, "ledger": ledger, "faults": injected,
            "requeues": requeues.records, "wall_s": wall, "slurm_restarts": int(info.get("Restarts", 0)),
            "in_allocation": text.count("restarting in the allocation"),
            "requeued_by_script": text.count("requeueing"), "loadavg": load}


def params(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["params"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def bitwise(d, ref_dir):
    x, y = params(os.path.join(d, "out", "model.h5")), params(os.path.join(ref_dir, "out", "model.h5"))
    same = x.keys() == y.keys() and all(np.array_equal(x[k].view(np.uint32), y[k].view(np.uint32)) for k in x)
    return same, len(x)


def report(r, ref_dir):
    done = r["done"]
    same, n = bitwise(r["dir"], ref_dir)
    print(f"\n== {r['name']}: job {r['job']}, {done['step']} steps, {len(r['faults'])} faults, "
          f"{r['in_allocation']} restarts in the allocation, {r['slurm_restarts']} requeues ==")
    print(f"goodput {100 * done['goodput']:.1f}% of {done['goodput_wall_s']:.1f} s since the first attempt "
          f"(useful {done['goodput_useful_s']:.1f} s); lost: start-up {done['lost_startup_s']:.1f} s, "
          f"checkpoint stalls {done['lost_checkpoint_stall_s']:.1f} s, recomputed steps "
          f"{done['lost_recompute_s']:.1f} s, restart gaps {done['lost_restart_gap_s']:.1f} s, other "
          f"{done['lost_other_s']:.1f} s")
    print(f"final parameters: {'BITWISE IDENTICAL' if same else 'DIFFERENT'} to the uninterrupted run ({n} arrays)")
    # One restart record per fault, in order (goodput.toml); a requeue raised the attempt count.
    restarts = r["ledger"].get("restart", [])
    if len(restarts) != len(r["faults"]):
        print(f"WARNING: {len(r['faults'])} faults but {len(restarts)} restarts in the ledger")
    if "job_restores_memory" in done:
        print(f"restores: {done['job_restores_memory']} from memory checkpoints, {done['job_restores_file']} from files")
    print(f"{'fault':<48} {'how':<18} {'from':<7} {'gap s':>7} {'start-up s':>10} {'recompute s':>11} {'lost s':>7}")
    attempt = 0
    for f, rs in zip(r["faults"], restarts):
        how = f"requeue (attempt {rs['slurm_restart_count']})" if rs["slurm_restart_count"] > attempt \
            else "in the allocation"
        attempt = rs["slurm_restart_count"]
        rs["how"], rs["fault"] = how, f["what"]
        lost = rs["restart_gap_s"] + rs["startup_s"] + rs["recompute_s"]
        print(f"{f['what'][:48]:<48} {how:<18} {rs.get('source', ''):<7} {rs['restart_gap_s']:>7.1f} {rs['startup_s']:>10.1f} "
              f"{rs['recompute_s']:>11.1f} {lost:>7.1f}")
    # Per kind of fault and what the script did: how many, and the mean and worst time lost.
    groups = {}
    for f, rs in zip(r["faults"], restarts):
        groups.setdefault((f["kind"], rs["how"].split(" (")[0]), []).append(rs)
    print(f"{'kind':<6} {'how':<18} {'n':>3} {'gap s':>12} {'start-up s':>11} {'recompute s':>12} "
          f"{'lost s mean':>12} {'max':>6}")
    for (kind, how), rows in sorted(groups.items()):
        def mean(k):
            return sum(x[k] for x in rows) / len(rows)
        lost = [x["restart_gap_s"] + x["startup_s"] + x["recompute_s"] for x in rows]
        print(f"{kind:<6} {how:<18} {len(rows):>3} {mean('restart_gap_s'):>12.1f} {mean('startup_s'):>11.1f} "
              f"{mean('recompute_s'):>12.1f} {sum(lost) / len(lost):>12.1f} {max(lost):>6.1f}")
    for q in r["requeues"]:
        rel = q["released_after_s"]
        print(f"requeue at {time.strftime('%H:%M:%S', time.localtime(q['at']))}: the queue would hold it "
              f"{q['queue_would_hold_s']:.0f} s; " + (f"released after {rel:.1f} s (StartTime=now)" if rel is not None
                                                      else "not released (waited for Slurm)"))
    return same


def main():
    os.makedirs(a.work, exist_ok=True)
    # A private copy: a rebuild during the hour this takes must not mix two binaries.
    private = os.path.join(a.work, "strata")
    shutil.copy2(a.strata, private)
    a.strata = private
    up = subprocess.run([os.path.join(ROOT, "slurm", "local-cluster.sh"), "up"],
                        env=dict(ENV, STRATA_SLURM_DIR=CLUSTER), capture_output=True, text=True)
    if up.returncode != 0:
        sys.exit(f"local-cluster.sh up failed: {up.stderr}")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.*)", cpu)
    say(f"CPU: {model.group(1) if model else '?'}, {os.cpu_count()} cores; strata {a.strata}")
    steps = a.steps
    if not steps:
        # The step rate of this job on this machine now, from a short probe.
        probe = run_arm("probe", 400, [], {})
        rate = probe["done"]["step"] / probe["done"]["train_time_s"]
        steps = int(rate * a.minutes * 60)
        say(f"probe: {rate:.1f} steps/s; training {steps} steps (~{a.minutes:g} min at that rate)")
    kinds = a.faults.split(",")
    rng = random.Random(a.seed)
    rng.shuffle(kinds)
    # More than any arm can meet: the job's end stops the faults.
    plan, t = [], 0.0
    for i in range(400):
        t += a.fault_every * rng.uniform(0.7, 1.3)
        plan.append((t, kinds[i % len(kinds)]))
    say("faults (seconds since the job started): " + ", ".join(f"{t:.0f} {k}" for t, k in plan[:12]) + ", ...")
    if a.reference:
        with open(os.path.join(a.reference, "out", "metrics.jsonl")) as f:
            done = [json.loads(l) for l in f if '"done"' in l][-1]
        if done["step"] != steps:
            sys.exit(f"--reference {a.reference} trained {done['step']} steps, not {steps}")
        ref = {"dir": a.reference, "done": done}
    else:
        ref = run_arm("uninterrupted", steps, [], {})
    print(f"\n== uninterrupted: {ref['done']['step']} steps in {ref['done']['train_time_s']:.1f} s of training; "
          f"goodput {100 * ref['done']['goodput']:.1f}% of {ref['done']['goodput_wall_s']:.1f} s ==")
    results = []
    for arm in a.arms.split(","):
        env = {"STRATA_MAX_RESTARTS": "0"} if arm == "requeue" else {}
        results.append(run_arm(arm, steps, plan, env))
    ok = all([report(r, ref["dir"]) for r in results])
    with open(os.path.join(a.work, "results.json"), "w") as f:
        json.dump({"uninterrupted": ref, "arms": results}, f, indent=1, default=str)
    print(f"\nresults in {a.work}/results.json")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
