#!/usr/bin/python3
"""model.pad_vocab changes the token table's layout, never the training: a GPT on a vocabulary of
300 (table padded to 384 rows) gives the unpadded run's losses bit for bit on one rank, on a
2-stage pipeline (the head's stage holds a copy of the table) and on --device cpu-staged (the
GPU path's copies); its files hold wte with 384 rows, zero past row 300, and vocab_size = 300.

Usage: padded_vocab.py STRATA WORKDIR. Exits 1 naming the first difference."""
import glob
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def losses(strata, work, name, data, pad, extra, launch=()):
    out = os.path.join(work, name)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: metrics.jsonl is appended to
    cmd = [*launch, strata, "train", "--data.path", data, "--model.type", "gpt", "--model.layers", "2",
           "--model.heads", "2", "--model.dim", "32", "--model.context", "16", "--train.batch_size", "8",
           "--train.max_steps", "4", "--train.optimizer", "adamw", "--train.weight_decay", "0.1",
           "--train.log_every", "1", "--checkpoint.every_steps", "4", "--model.pad_vocab", pad,
           "--output.dir", out, "--quiet", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l)["loss"] for l in f if '"loss"' in l], out


def main():
    strata, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "v300.h5")
    rng = np.random.default_rng(3)
    with h5py.File(data, "w") as f:
        f["train/tokens"] = rng.integers(0, 300, 4000).astype(np.uint16)
        f.attrs["kind"] = "tokens"
        f.attrs["vocab"] = np.int64(300)
    mpirun = ("mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none")
    for name, extra, launch in (("one rank", [], ()), ("cpu-staged", ["--device", "cpu-staged"], ()),
                                ("2-stage pipeline", ["--parallel.pipeline_stages", "2"], mpirun)):
        plain, _ = losses(strata, work, name.replace(" ", "-") + "-plain", data, "false", extra, launch)
        padded, out = losses(strata, work, name.replace(" ", "-") + "-padded", data, "true", extra, launch)
        if len(plain) != 4 or plain != padded:
            print(f"FAIL: {name}: losses unpadded {plain}, padded {padded}")
            return 1
        for path in [os.path.join(out, "model.h5")] + glob.glob(os.path.join(out, "checkpoints", "ckpt-*.h5")):
            with h5py.File(path) as f:
                wte = f["params/embedding1/wte"][()]
                if wte.shape != (384, 32) or np.any(wte[300:] != 0) or f.attrs.get("vocab_size") != 300:
                    print(f"FAIL: {path}: wte {wte.shape}, padding rows zero: {not np.any(wte[300:])}, "
                          f"vocab_size {f.attrs.get('vocab_size')}")
                    return 1
        print(f"ok: {name}: padded and unpadded losses identical ({plain[-1]!r} at step 4); files hold "
              f"wte (384, 32), zero past row 300, vocab_size 300")
    return 0


if __name__ == "__main__":
    sys.exit(main())
