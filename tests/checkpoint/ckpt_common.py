"""Helpers for the checkpoint tests: launching strata, reading what it wrote, comparing runs."""
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mpi"))
from common import MPI_ENV, losses, metrics, metrics_so_far, parameters  # noqa: E402,F401

import h5py  # noqa: E402
import numpy as np  # noqa: E402


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def launch(strata, ranks, args, env=None):
    """Starts `strata train ARGS` on `ranks` ranks (mpirun, or directly for 1 rank)."""
    cmd = [strata, "train"] + args
    if ranks > 1:
        cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    return subprocess.Popen(cmd, env=dict(MPI_ENV, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def descendants(pid):
    """All live descendants of `pid` (mpirun puts its ranks in process groups of their own)."""
    children = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_all(p):
    """SIGKILL a launched run: every rank and mpirun at once, none gets to clean up."""
    for pid in descendants(p.pid) + [p.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(strata, ranks, args, expect=0, env=None, timeout=600):
    p = launch(strata, ranks, args, env)
    out, err = p.communicate(timeout=timeout)
    if p.returncode != expect:
        fail(f"strata train {' '.join(args)} on {ranks} rank(s) exited {p.returncode}, expected "
             f"{expect}\n{out[-3000:]}\n{err[-3000:]}")
    return out, err


def fresh(path):
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def all_tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def assert_bitwise(a_path, b_path, what):
    a, b = parameters(a_path), parameters(b_path)
    if a.keys() != b.keys():
        fail(f"{what}: different tensors {sorted(a)} vs {sorted(b)}")
    for k in a:
        if a[k].shape != b[k].shape or not np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)):
            diff = np.max(np.abs(a[k].astype(np.float64) - b[k]))
            fail(f"{what}: {k} differs (max abs diff {diff:.3e})")
    print(f"{what}: {len(a)} tensors bitwise identical")


def train_losses(metrics_path):
    """Loss by step from a metrics file (later lines win: a resumed run repeats some steps)."""
    out = {}
    for m in metrics(metrics_path):
        if "event" not in m:
            out[int(m["step"])] = float(m["loss"])
    return out
