"""Helpers for tests that launch strata under mpirun and read what it wrote."""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")


def fresh_dir(parent, name):
    """parent/name, emptied: a test's own work directory."""
    path = os.path.join(parent, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def art_text(strata, work):
    """A small byte-level corpus (Debian's fortunes, art) as a token file in work/art.h5."""
    path = os.path.join(work, "art.h5")
    if not os.path.exists(path):
        subprocess.run([strata, "prepare", "text", "--input", "/usr/share/games/fortunes/art",
                        "--out", path], env=MPI_ENV, check=True, capture_output=True)
    return path


def run_checked(cmd, env=None, timeout=600):
    """Runs cmd (with MPI_ENV plus env); fails the test on a non-zero exit, showing its output."""
    p = subprocess.run(cmd, env=dict(MPI_ENV, **(env or {})), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    return p


def strata_cmd(strata, ranks=1):
    """strata alone for one rank, under mpirun for more."""
    return [strata] if ranks == 1 else ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none", strata]


def run_strata(strata, ranks, args, timeout=600):
    """Runs `strata train ARGS` on `ranks` ranks under mpirun; fails the test on a non-zero exit."""
    return run_checked(["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none", strata] + args,
                       timeout=timeout)


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def metrics_so_far(path):
    """The lines of a metrics file a running strata is still appending to, [] before it exists:
    the last line without its newline yet is being written (a poll read one cut at its 113th
    character, in a CI run of kill_resume.py) and is left for the next look."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        whole = f.read().split("\n")[:-1]
    return [json.loads(line) for line in whole if line.strip()]


def losses(path):
    return np.array([m["loss"] for m in metrics(path) if "event" not in m], dtype=np.float64)


def parameters(path):
    """All parameter arrays of a strata parameter file, by global name."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f["params"].visititems(visit)
    return out


class Checks:
    """Collects a test's failures: check(cond, msg) prints "FAIL: msg" when cond is false and
    carries on, so one run reports every failure; finish() prints PASS or FAIL and exits."""

    def __init__(self):
        self.ok = True

    def __call__(self, cond, msg):
        if not cond:
            print(f"FAIL: {msg}")
            self.ok = False

    def finish(self):
        print("PASS" if self.ok else "FAIL")
        sys.exit(0 if self.ok else 1)
