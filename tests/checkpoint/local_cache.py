"""The node-local checkpoint cache (checkpoint.local_dir). Usage:
local_cache.py STRATA DATA WORKDIR CASE, CASE one of

  lost     a run killed (SIGKILL, 2 ranks) whose node-local copies are then deleted resumes
           from the shared directory and ends bitwise identical to an uninterrupted run
  newer    the shared directory lags (its newest checkpoint and `latest` rolled back, as when
           a node dies before the copy finished): the newer local copy is resumed from, the
           shared directory catches up with a byte-identical copy, the run ends bitwise
  reader   two "nodes" (SLURMD_NODENAME per rank, so %n gives each its own local directory):
           the newest copy is on rank 1's node, and rank 1 reads it for everyone; a damaged
           local copy is set aside for the next candidate
"""
import filecmp
import glob
import os
import subprocess
import sys
import time

from ckpt_common import MPI_ENV, assert_bitwise, fail, fresh, kill_all, launch, metrics, run

strata, data, work, case = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
work = fresh(os.path.join(work, f"local-cache-{case}"))
common = ["--data.path", data, "--model.hidden", "64", "--train.seed", "5",
          "--checkpoint.every_steps", "50", "--checkpoint.keep_last", "20",
          "--train.log_every", "10", "--progress", "off"]


def steps_of(d):
    return sorted(int(os.path.basename(p)[5:14]) for p in glob.glob(os.path.join(d, "ckpt-*.h5")))


def latest(d):
    with open(os.path.join(d, "latest")) as f:
        return f.readline().strip()


def cache_dir(local_root):
    """The run's directory inside a local root: strata-<id of checkpoint.dir/cache-id>."""
    found = glob.glob(os.path.join(local_root, "strata-*"))
    if len(found) != 1:
        fail(f"expected one strata-<id> directory in {local_root}, found {found}")
    return found[0]


def ref_run(steps):
    d = os.path.join(work, f"ref-{steps}")
    run(strata, 2, common + ["--train.max_steps", str(steps), "--output.dir", d])
    return os.path.join(d, "model.h5")


if case == "lost":
    steps = 600
    ref = ref_run(steps)
    out, local = os.path.join(work, "run"), os.path.join(work, "local")
    args = common + ["--train.max_steps", str(steps), "--output.dir", out, "--resume", "auto",
                     "--checkpoint.local_dir", local]
    p = launch(strata, 2, args)
    shared = os.path.join(out, "checkpoints")
    t0 = time.time()
    while p.poll() is None and (not os.path.exists(os.path.join(shared, "latest")) or
                                int(latest(shared)[5:14]) < 200):
        if time.time() - t0 > 300:
            kill_all(p)
            fail("no checkpoint of step >= 200 reached the shared directory in 300 s")
        time.sleep(0.01)
    if p.poll() is not None:
        fail(f"the run ended ({p.returncode}) before it could be killed\n{p.communicate()[1][-2000:]}")
    kill_all(p)
    p.communicate()
    cache = cache_dir(local)
    print(f"killed; local copies {steps_of(cache)}, shared {steps_of(shared)} (latest {latest(shared)})")
    if not steps_of(cache) or not steps_of(shared):
        fail("the local cache or the shared directory holds no checkpoint")
    subprocess.run(["rm", "-rf", local], check=True)  # the node's local disk is gone
    o, _ = run(strata, 2, args)
    resumed = [l for l in o.splitlines() if l.startswith("resumed from")]
    if len(resumed) != 1 or not resumed[0].startswith(f"resumed from {shared}/"):
        fail(f"expected to resume from the shared directory {shared}: {resumed}")
    print(resumed[0])
    assert_bitwise(ref, os.path.join(out, "model.h5"), "local copies lost, resumed from the shared one")

elif case == "newer":
    ref = ref_run(400)
    out, local = os.path.join(work, "run"), os.path.join(work, "local")
    args = common + ["--output.dir", out, "--resume", "auto", "--checkpoint.local_dir", local]
    run(strata, 2, args + ["--train.max_steps", "200"])
    shared, cache = os.path.join(out, "checkpoints"), cache_dir(local)
    # Every checkpoint is written locally; the shared copy of one may be superseded by a newer
    # one while the copier is still busy (SharedCopier keeps only the newest waiting), so on a
    # loaded machine the shared directory can skip an intermediate step, never the last.
    every = list(range(50, 201, 50))
    if steps_of(cache) != every or 200 not in steps_of(shared) or \
            not set(steps_of(shared)) <= set(every):
        fail(f"after 200 steps: shared {steps_of(shared)}, local {steps_of(cache)}")
    # The copy of step 200 never reached the shared directory.
    os.remove(os.path.join(shared, "ckpt-000000200.h5"))
    with open(os.path.join(shared, "latest"), "w") as f:
        f.write("ckpt-000000150.h5\n")
    o, _ = run(strata, 2, args + ["--train.max_steps", "400"])
    want = f"resumed from {cache}/ckpt-000000200.h5 at step 200"
    if want not in o:
        fail(f"expected '{want}':\n{o[-2500:]}")
    if "is behind the node-local copy (step 200 vs 150)" not in o:
        fail(f"strata did not say the shared directory is behind:\n{o[-2500:]}")
    a, b = os.path.join(cache, "ckpt-000000200.h5"), os.path.join(shared, "ckpt-000000200.h5")
    if not os.path.exists(b) or not filecmp.cmp(a, b, shallow=False):
        fail(f"the shared directory did not catch up with a copy of {a}")
    at_end = steps_of(shared)
    if latest(shared) != "ckpt-000000400.h5" or 400 not in at_end or \
            not set(at_end) <= set(range(50, 401, 50)):
        fail(f"shared directory at the end: {at_end}, latest {latest(shared)}")
    print(f"resumed from the local copy at step 200; the shared directory caught up ({b} "
          f"byte-identical) and ends at 400 ({len(at_end)} of 8 checkpoints copied)")
    assert_bitwise(ref, os.path.join(out, "model.h5"), "resumed from a local copy newer than the shared one")

elif case == "reader":
    ref = ref_run(400)
    out = os.path.join(work, "run")
    local = os.path.join(work, "local-%n")
    args = common + ["--output.dir", out, "--resume", "auto", "--checkpoint.local_dir", local]

    def two_nodes(rank0_node, rank1_node, max_steps):
        """mpirun with each rank on a "node" of its own (SLURMD_NODENAME)."""
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none"]
        for i, node in enumerate((rank0_node, rank1_node)):
            if i:
                cmd.append(":")
            cmd += ["-n", "1", "-x", f"SLURMD_NODENAME={node}", strata, "train"] + args + \
                   ["--train.max_steps", str(max_steps)]
        p = subprocess.run(cmd, env=MPI_ENV, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        return p.stdout, p.stderr

    two_nodes("a", "b", 200)  # rank 0 writes into local-a
    cache_a = cache_dir(os.path.join(work, "local-a"))
    if os.path.exists(os.path.join(work, "local-b")) and steps_of(cache_dir(os.path.join(work, "local-b"))):
        fail("rank 1's node holds checkpoints it never wrote")
    shared = os.path.join(out, "checkpoints")
    os.remove(os.path.join(shared, "ckpt-000000200.h5"))  # the shared copy lags behind
    with open(os.path.join(shared, "latest"), "w") as f:
        f.write("ckpt-000000150.h5\n")
    # The newest local copy is damaged: set aside, and the next local one (150, as new as the
    # shared latest) is taken.
    damaged = os.path.join(cache_a, "ckpt-000000200.h5")
    os.truncate(damaged, os.path.getsize(damaged) // 2)
    o, e = two_nodes("b", "a", 400)  # now node a holds rank 1
    if "skipping damaged checkpoint" not in e or not os.path.exists(os.path.join(cache_a, "ckpt-000000200.h5.corrupt")):
        fail(f"the damaged local copy was not set aside:\n{e[-2000:]}")
    want = f"resumed from {cache_a}/ckpt-000000150.h5 at step 150"
    if want not in o:
        fail(f"expected '{want}' (read by rank 1, on node a):\n{o[-2500:]}")
    print(f"rank 1 (node a) read {cache_a}/ckpt-000000150.h5 for both ranks, after setting aside the damaged 200")
    assert_bitwise(ref, os.path.join(out, "model.h5"), "resumed from rank 1's node-local copy")
else:
    fail(f"unknown case {case}")
print("PASS")
