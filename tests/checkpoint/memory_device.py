"""Memory checkpoints of a GPU's state (issue 33): the parameters and optimizer state leave the
device on a copy stream into pinned buffers (Backend::snapshot_*), not through the training
thread's downloads. On --device cpu-staged (separate memory, the GPU path's calls): 2 ranks as
two nodes, memory_every = 1, rank 1 killed (SIGKILL) after the memory checkpoint of step 25; the
relaunch resumes from memory at step 25 and ends bitwise equal to the uninterrupted run.

On --device cpu the same run's generations are written by the optimizer's update itself (the
state lives in the memory directory's files; the line saying so is checked), SGD and AdamW.

With --budget B (checkpoint.memory_budget, on --device cpu, saves copied: memory_every = 2):
the interval grows from 2 after the first 16 saves (the line saying so is checked), rank 1 is
killed after step 60 of 80 (the line may be the
killed launch's), and the relaunch resumes from memory at the newest save at or
before it (step 16 at least), bitwise.

With --in-update (on --device cpu): rank 1 is killed inside the update that completes step 26,
its generation written in place but not sealed (STRATA_TEST_KILL_IN_UPDATE). The two ranks are
replicas on two nodes, so each writes one generation in place (the start-up line says so); the
relaunch removes rank 1's unsealed file and resumes at step 26 from rank 0's copy (the line
naming a replica's copy is checked), bitwise, SGD and AdamW.

With --budget B --every 1 (on --device cpu, where the update can write the generations) the
budget judges the update's own cost: timed in place over steps 1-16 (no saves), then writing
the generations over steps 17-32. B = 0.99 (any cost fits): the update goes on writing every
generation (the line saying so is checked) and the relaunch resumes at step 60 itself; B =
0.000001 (no cost fits): copies from step 33 (checked), whose interval then grows (checked),
and the relaunch resumes at the newest copy, bitwise both.

    memory_device.py STRATA DATA WORKDIR [--device cpu-staged | --device cpu [--in-update 1] |
                                          --budget B [--every 1]]
"""
import os
import re
import subprocess
import sys

from ckpt_common import MPI_ENV, assert_bitwise, fail, fresh

strata, data, work = sys.argv[1], sys.argv[2], sys.argv[3]
opt = dict(zip(sys.argv[4::2], sys.argv[5::2]))
budget = opt.get("--budget")
device = opt.get("--device", "cpu" if budget else "cpu-staged")
every = opt.get("--every", "2" if budget else "1")
# The budget's probe decides whether the update goes on writing the generations.
probe = budget is not None and every == "1"
kept = probe and float(budget) >= 0.5
in_update = "--in-update" in opt
work = fresh(os.path.join(work, f"memory-{'budget-' + budget + '-every-' + every if budget else 'device-' + device}{'-in-update' if in_update else ''}"))
STEPS, KILL = (80, 60) if budget else (40, 25)
common = ["train", "--data.path", data, "--device", device, "--train.max_steps", str(STEPS),
          "--train.seed", "3", "--train.log_every", "10", "--progress", "off",
          "--checkpoint.every_steps", "1000", "--model.dropout", "0.1"]


def launch(args, env=None, expect=0):
    """Two ranks as nodes n1 and n2 (each rank's part is also sent to its partner)."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none",
           "-n", "1", "-x", "SLURMD_NODENAME=n1", strata, *args, ":",
           "-n", "1", "-x", "SLURMD_NODENAME=n2", strata, *args]
    p = subprocess.run(cmd, env=dict(MPI_ENV, **(env or {})), capture_output=True, text=True,
                       timeout=600)
    if (p.returncode == 0) != (expect == 0):
        fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


IN_UPDATE = "memory checkpoints: the optimizer's update writes each generation"
IN_PLACE = "in place in one generation, the replicas' copies standing in for an update cut short"


def fault_and_resume(common, tag):
    """The uninterrupted run, and a run killed at KILL whose relaunch resumes from memory, bitwise."""
    ref = os.path.join(work, tag, "ref")
    launch(common + ["--output.dir", ref])
    memory = ["--checkpoint.memory_every", every,
              "--checkpoint.memory_dir", os.path.join(work, tag, "mem", "%n")]
    if budget:
        memory += ["--checkpoint.memory_budget", budget]
    out_dir = os.path.join(work, tag, "faulted")
    kill = {"STRATA_TEST_KILL_IN_UPDATE": f"{KILL + 1}:1"} if in_update else {"STRATA_TEST_KILL_AT_STEP": f"{KILL}:1"}
    first = launch(common + memory + ["--output.dir", out_dir], env=kill, expect=1)
    if (IN_UPDATE in first) != (device == "cpu" and (probe or not budget)):
        fail(f"the update {'did not write' if device == 'cpu' else 'wrote'} the generations "
             f"({tag} on {device}):\n{first[-3000:]}")
    if in_update and IN_PLACE not in first:
        fail(f"no line says the update writes one generation in place ({tag}):\n{first[-3000:]}")
    out = launch(common + memory + ["--output.dir", out_dir, "--resume", "auto"])
    check_resumed(out, first)
    assert_bitwise(os.path.join(out_dir, "model.h5"), os.path.join(ref, "model.h5"),
                   f"{tag} resumed from memory on {device}")


def check_resumed(out, first):
    resumed = [l for l in out.splitlines() if l.startswith("resumed from memory")]
    at = int(resumed[0].split("at step ")[1].split(":")[0]) if resumed else -1
    want = KILL + 1 if in_update else KILL
    if not (16 <= at <= KILL if budget and not kept else at == want):
        fail(f"the relaunch did not resume from memory at step {'16..' if budget and not kept else ''}{want}:\n{out[-3000:]}")
    if in_update and "1 part(s) from a data-parallel replica's copy" not in resumed[0]:
        fail(f"the relaunch did not take rank 1's part from its replica: {resumed[0]}")
    if in_update and "is damaged" in out:  # the cut update's file is marked, not found damaged
        fail(f"the relaunch found a damaged copy where the cut update's file was marked:\n{out[-3000:]}")
    print(resumed[0])
    if probe:
        said = "the update goes on writing every generation from step 32" if kept else "copies from step 33"
        line = [l for l in first.splitlines() if l.startswith("memory checkpoints: " + said)]
        if not line:
            fail(f"no line says '{said}' (checkpoint.memory_budget {budget}):\n{first[-3000:]}")
        print(line[0])
    if budget and not kept:
        grown = [l for l in (first + out).splitlines()
                 if re.match(r"memory checkpoints: every \d+ steps from step", l)]
        if not grown:
            fail(f"no line says the budget's interval:\n{out[-3000:]}")
        print(grown[0])


fault_and_resume(common, "sgd")
if device == "cpu" and not budget:
    fault_and_resume(common + ["--train.optimizer", "adamw", "--train.lr", "0.001"], "adamw")
