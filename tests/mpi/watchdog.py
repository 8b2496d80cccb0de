#!/usr/bin/python3
"""The watchdog names a rank that stops making progress and aborts the job with exit code 5
(kExitHung) within its timeout, and stays quiet while every rank progresses.

Usage: watchdog.py STRATA DATA.h5 WORKDIR CASE
  hang-rank1, hang-rank0  2 ranks; the test hook STRATA_TEST_HANG makes that rank sleep
                          forever in step 5: its own watchdog names it
  hang-single             1 rank, no mpirun (MPI singleton): the self-check alone
  hang-stage1             2 ranks as a 2-stage pipeline, rank 1 (the last stage) hangs: it is
                          named, not rank 0, which waits for its gradients in a receive
  hang-stage1-interleaved the same with the interleaved schedule (2 chunks per stage: rank 0
                          waits for its second chunk's input from rank 1)
  stop-rank2, stop-rank0  SIGSTOP that rank's process after some steps (4 and 2 ranks): its
                          heartbeats stop and the rank watching it (0, resp. 1) names it
  stop-heartbeat          stop-rank0's case, rank 1 stopped, with timeout 60 s and
                          heartbeat_timeout_s 1: named after about 1 s, not 60
  deadlock                rank 1 enters a barrier rank 0 never joins: every rank waits
  no-false-alarm          2 ranks, timeout 2 s: rank 1 spends 6 s in an exempt phase (rank 0
                          waits 6 s in a collective), rank 0 is busy 1.5 s in one step: the
                          run finishes normally
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

from common import MPI_ENV

strata, data, work, case = sys.argv[1:5]
out = os.path.join(work, f"watchdog-{case}")
os.makedirs(out, exist_ok=True)
metrics_path = os.path.join(out, "metrics.jsonl")
if os.path.exists(metrics_path):
    os.remove(metrics_path)
HOST = socket.gethostname()
HUNG = 5  # kExitHung


def fail(msg, p=None, stdout="", stderr=""):
    sys.exit(f"FAIL [{case}]: {msg}\n--- stdout (tail)\n{stdout[-2000:]}\n--- stderr (tail)\n{stderr[-4000:]}")


def command(ranks, timeout_s, steps, extra=()):
    args = ["train", "--data.path", data, "--train.max_steps", str(steps), "--train.log_every", "10",
            "--output.dir", out, "--quiet", "--watchdog.timeout_s", str(timeout_s)] + list(extra)
    if ranks == 0:  # no launcher
        return [strata] + args
    return ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none", strata] + args


def launch(cmd, hang=None):
    env = dict(MPI_ENV)
    env.pop("STRATA_TEST_HANG", None)
    if hang:
        env["STRATA_TEST_HANG"] = hang
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(p, limit):
    """Waits up to `limit` seconds; on overrun kills the whole job (its own session only)."""
    try:
        so, se = p.communicate(timeout=limit)
        return p.returncode, so, se
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        so, se = p.communicate()
        fail(f"still running after {limit} s: the watchdog did not end the job", p, so, se)


def watchdog_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("strata: error: watchdog:")]


def expect_named(rc, so, se, rank, step_re, detail_re, timeout_s, elapsed, limit, slack=0.0):
    if rc != HUNG:
        fail(f"exit code {rc}, expected {HUNG} (kExitHung through MPI_Abort)", None, so, se)
    lines = watchdog_lines(se)
    if len(lines) != 1:
        fail(f"expected exactly one watchdog line, got {len(lines)}", None, so, se)
    m = re.fullmatch(rf"strata: error: watchdog: rank (\d+) \(host (\S+)\) made no progress for "
                     rf"([\d.]+) s {step_re} \((.*)\); aborting the job", lines[0])
    if not m:
        fail(f"watchdog line has an unexpected form: {lines[0]!r}", None, so, se)
    if int(m[1]) != rank or m[2] != HOST:
        fail(f"named rank {m[1]} on {m[2]}, expected rank {rank} on {HOST}", None, so, se)
    if not float(m[3]) >= timeout_s:
        fail(f"reported {m[3]} s without progress, less than the timeout {timeout_s} s", None, so, se)
    if not re.search(detail_re, m[4]):
        fail(f"detail {m[4]!r} does not match {detail_re!r}", None, so, se)
    if not timeout_s - slack <= elapsed <= limit:
        fail(f"job ended {elapsed:.1f} s after the hang, expected within [{timeout_s - slack}, {limit}] s",
             None, so, se)
    print(f"{case}: exit {rc} {elapsed:.1f} s after the hang (timeout {timeout_s} s): {lines[0]}")


def rank_pid(mpirun_pid, rank):
    """The strata process of `rank` among this mpirun's children (never another job's)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
                return int(d)
        except (OSError, ValueError, IndexError):
            continue
    return None


def run_timed(cmd, timeout, hang=None):
    """Launches, waits for the end; returns the process, its exit code, output and wall time
    (start-up included: it bounds the detection time from above)."""
    t0 = time.monotonic()
    p = launch(cmd, hang=hang)
    rc, so, se = finish(p, timeout)
    return p, rc, so, se, time.monotonic() - t0


if case in ("hang-rank1", "hang-rank0", "hang-single", "hang-stage1", "hang-stage1-interleaved"):
    rank = 1 if case in ("hang-rank1", "hang-stage1", "hang-stage1-interleaved") else 0
    ranks = 0 if case == "hang-single" else 2
    extra = ["--parallel.pipeline_stages", "2", "--parallel.microbatches", "4"] if "stage1" in case else []
    if case == "hang-stage1-interleaved":
        extra += ["--parallel.schedule", "interleaved", "--parallel.virtual_stages", "2",
                  "--model.hidden", "64", "64"]
    T = 3
    p, rc, so, se, elapsed = run_timed(command(ranks, T, 1000, extra), 60, hang=f"{rank}:5")
    expect_named(rc, so, se, rank, "in step 5", r"^busy since the step began, outside any "
                 r"collective; its own watchdog noticed$", T, elapsed, 30)

elif case in ("stop-rank2", "stop-rank0", "stop-heartbeat"):
    rank = 1 if case == "stop-heartbeat" else int(case[-1])
    ranks = 4 if rank == 2 else 2
    watcher = 0 if rank != 0 else 1
    T = 3  # the silence that names the rank
    extra = ["--train.epochs", "100"]
    if case == "stop-heartbeat":
        T = 1
        extra += ["--watchdog.heartbeat_timeout_s", str(T)]
    p = launch(command(ranks, 60 if case == "stop-heartbeat" else T, 100000, extra))
    # Wait for training to be under way (the first metrics line), then stop the rank.
    deadline = time.monotonic() + 60
    while not (os.path.exists(metrics_path) and os.path.getsize(metrics_path) > 0):
        if p.poll() is not None or time.monotonic() > deadline:
            so, se = p.communicate() if p.poll() is not None else ("", "")
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            fail("training did not start", p, so, se)
        time.sleep(0.05)
    time.sleep(1.0)  # a few heartbeats sent while training (they carry the step)
    pid = rank_pid(p.pid, rank)
    if pid is None:
        os.killpg(p.pid, signal.SIGKILL)
        fail(f"no process of rank {rank} among mpirun's children")
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        rc, so, se = finish(p, 60)
    finally:
        try:  # never leave a stopped process behind
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    elapsed = time.monotonic() - t0
    # Silence is counted from the last heartbeat read: sent up to timeout/4 before the SIGSTOP,
    # and read up to a check (timeout/8) after it arrived.
    expect_named(rc, so, se, rank, r"in step \d+", rf"^its heartbeats stopped: .*; its last "
                 rf"heartbeat \(in step \d+\) said: .*; noticed by rank {watcher}$", T, elapsed,
                 T + 15, slack=3 * T / 8)
    # The step named is the one the job is stuck in, not the last heartbeat's (heartbeats come
    # every timeout/4 s, many steps apart): the watcher's step, at least the last the metrics
    # logged (a count of steps done, so the 0-based step after them) less one: rank 0 can log
    # step N (0-based N - 1 done) and stop while the watcher still waits for the last message
    # of step N - 1's allreduce (a non-blocking collective completes on one rank before
    # another; seen in CI under load: named 159, logged 160).
    named = int(re.search(r"made no progress for [\d.]+ s in step (\d+)", se)[1])
    with open(metrics_path) as f:
        logged = [json.loads(l)["step"] for l in f if '"event"' not in l]
    if logged and named < max(logged) - 1:
        fail(f"named step {named}, but the metrics logged step {max(logged)} before the hang",
             None, so, se)

elif case == "deadlock":
    T = 3
    p, rc, so, se, elapsed = run_timed(command(2, T, 1000), 60, hang="1:5:barrier")
    lines = watchdog_lines(se)
    if rc != HUNG or len(lines) != 1:
        fail(f"exit code {rc} with {len(lines)} watchdog lines, expected {HUNG} and one", p, so, se)
    want = (r"strata: error: watchdog: no rank made progress for ([\d.]+) s, every one waiting for "
            r"another \(rank 0 waiting in MPI_Allreduce in step 5, rank 1 waiting in MPI_Barrier in "
            r"step 5\): a deadlock between ranks, or the network stopped; aborting the job")
    m = re.fullmatch(want, lines[0])
    if not m or float(m[1]) < T or not T <= elapsed <= 30:
        fail(f"unexpected line or timing ({elapsed:.1f} s): {lines[0]!r}", p, so, se)
    print(f"{case}: exit {rc} after {elapsed:.1f} s (timeout {T} s): {lines[0]}")

elif case == "no-false-alarm":
    T = 2
    p, rc, so, se, elapsed = run_timed(command(2, T, 200), 120, hang="1:30:6:exempt,0:60:1.5")
    if rc != 0 or watchdog_lines(se):
        fail(f"exit code {rc}, expected 0 with no watchdog line", p, so, se)
    if elapsed < 7.5:
        fail(f"took {elapsed:.1f} s: the hook's 6 s + 1.5 s pauses did not happen", p, so, se)
    if '"event": "done"' not in open(metrics_path).read():
        fail("no done line in metrics.jsonl", p, so, se)
    print(f"{case}: finished normally in {elapsed:.1f} s (timeout {T} s, a 6 s exempt phase on "
          f"rank 1, a 1.5 s busy step on rank 0)")

else:
    sys.exit(f"unknown case {case}")
