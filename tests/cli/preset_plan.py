#!/usr/bin/python3
"""model.preset's parameter counts as a run prints them, without training: `strata train
--dry_run` on a token file of GPT-2's vocabulary (made here with numpy; nothing allocated).

Usage: preset_plan.py STRATA WORKDIR
Checks the `plan:` line of gpt2 (124,439,808 parameters, 124,475,904 allocated with the token
table's 47 padding rows of 768) and gpt2-xl (1,557,611,200), and that model.pad_vocab = false
allocates exactly the parameters it uses. Exits 1 naming the first mismatch."""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def main():
    strata, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "gpt2-vocab.h5")
    with h5py.File(data, "w") as f:
        f["train/tokens"] = np.random.default_rng(0).integers(0, 50257, 2 * 1024 + 1).astype(np.uint16)
        f.attrs["kind"] = "tokens"
        f.attrs["vocab"] = np.int64(50257)
    cases = [(["--model.preset", "gpt2"],
              "plan: 124,439,808 parameters (124,475,904 allocated: the token table's padding rows); "),
             (["--model.preset", "gpt2", "--model.pad_vocab", "false"], "plan: 124,439,808 parameters; "),
             (["--model.preset", "gpt2-xl"], "plan: 1,557,611,200 parameters (1,557,686,400 allocated")]
    for flags, want in cases:
        cmd = [strata, "train", "--dry_run", "--data.path", data, "--train.batch_size", "1",
               "--output.dir", os.path.join(work, "out"), "--quiet", *flags]
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
        plan = [l for l in p.stdout.splitlines() if l.startswith("plan: ")]
        if p.returncode != 0 or len(plan) != 1 or not plan[0].startswith(want):
            print(f"FAIL: {' '.join(cmd)}\n  exit {p.returncode}; expected a line starting {want!r}\n"
                  f"{p.stdout}{p.stderr}")
            return 1
        if os.path.exists(os.path.join(work, "out", "model.h5")):
            print(f"FAIL: --dry_run wrote a parameter file: {' '.join(cmd)}")
            return 1
        print(f"ok: {plan[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
