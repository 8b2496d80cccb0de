"""Memory checkpoints of a GPU's state (issue 33): the parameters and optimizer state leave the
device on a copy stream into pinned buffers (Backend::snapshot_*), not through the training
thread's downloads. On --device cpu-staged (separate memory, the GPU path's calls): 2 ranks as
two nodes, memory_every = 1, rank 1 killed (SIGKILL) after the memory checkpoint of step 25; the
relaunch resumes from memory at step 25 and ends bitwise equal to the uninterrupted run.

    memory_device.py STRATA DATA WORKDIR [--device cpu-staged]
"""
import os
import subprocess
import sys

from ckpt_common import MPI_ENV, assert_bitwise, fail, fresh

strata, data, work = sys.argv[1], sys.argv[2], sys.argv[3]
device = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--device" else "cpu-staged"
work = fresh(os.path.join(work, f"memory-device-{device}"))
STEPS, KILL = 40, 25
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
    return p.stdout


ref = os.path.join(work, "ref")
launch(common + ["--output.dir", ref])
memory = ["--checkpoint.memory_every", "1", "--checkpoint.memory_dir", os.path.join(work, "mem", "%n")]
out_dir = os.path.join(work, "faulted")
launch(common + memory + ["--output.dir", out_dir], env={"STRATA_TEST_KILL_AT_STEP": f"{KILL}:1"},
       expect=1)
out = launch(common + memory + ["--output.dir", out_dir, "--resume", "auto"])
resumed = [l for l in out.splitlines() if l.startswith("resumed from memory")]
if not resumed or f"at step {KILL}:" not in resumed[0]:
    fail(f"the relaunch did not resume from memory at step {KILL}:\n{out[-3000:]}")
print(resumed[0])
assert_bitwise(os.path.join(out_dir, "model.h5"), os.path.join(ref, "model.h5"),
               f"resumed from memory on {device}")
