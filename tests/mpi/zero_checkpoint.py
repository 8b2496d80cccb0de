#!/usr/bin/python3
"""ZeRO checkpoints written by every rank at once (checkpoint.writer = parallel: parallel HDF5)
are the files rank 0 writes from the gathered shards (checkpoint.writer = rank0).

For an MLP on D = 3 (shards that split rows of the weight matrices, so each rank writes a
union of partial and whole rows), a GPT on D = 2, and the GPT on 2 pipeline stages x D = 2
(each stage's replicas write its tensors; the last stage's copy of the token table is not
written, the first stage's table is), zero = 2,
AdamW, checkpoints at steps 10 and 20 with each writer:
  - every dataset of the two files (parameters and optimizer state) bitwise the same, with the
    same crc32 attribute, and that attribute the CRC-32 of the dataset's bytes (so the CRC
    combined from the ranks' pieces is the whole tensor's);
  - the same root attributes but created_utc (and, in the config, the writer and output.dir);
  - the parallel file resumes: to step 30 on the same grid bitwise the uninterrupted run's
    model.h5, and on one rank (without ZeRO) within 1e-6 relative of its losses.

Usage: zero_checkpoint.py STRATA DATA WORKDIR     (DATA: fashion-mnist.h5)
"""
import os
import shutil
import sys
import zlib

import h5py
import numpy as np

from common import art_text, Checks, losses, parameters, run_strata

strata, mnist, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
text = art_text(strata, work)
MLP = ["--data.path", mnist, "--model.hidden", "50", "--train.batch_size", "48"]
GPT = ["--data.path", text, "--model.type", "gpt", "--model.layers", "2", "--model.heads", "4",
       "--model.dim", "32", "--model.context", "16", "--train.batch_size", "8"]
COMMON = ["--train.optimizer", "adamw", "--train.lr", "0.002", "--train.log_every", "1",
          "--checkpoint.every_steps", "10", "--checkpoint.keep_last", "10", "--quiet"]
check = Checks()


def train(tag, ranks, args):
    out = os.path.join(work, tag)
    shutil.rmtree(out, ignore_errors=True)
    run_strata(strata, ranks, ["train", "--output.dir", out] + COMMON + args)
    return out


def contents(path):
    with h5py.File(path, "r") as f:
        sets = {}
        f.visititems(lambda n, o: sets.__setitem__(n, (o[()], int(o.attrs["crc32"])))
                     if isinstance(o, h5py.Dataset) else None)
        attrs = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in f.attrs.items()
                 if k != "created_utc"}
        # The config differs where the two runs were told differently: the writer, output.dir.
        attrs["config"] = [l for l in attrs["config"].splitlines()
                           if not l.startswith(("writer = ", "dir = "))]
    return sets, attrs


for name, ranks, model, grid in [("mlp-d3", 3, MLP, []), ("gpt-d2", 2, GPT, []),
                                 ("gpt-p2d2", 4, GPT, ["--parallel.pipeline_stages", "2"])]:
    args = model + grid
    runs = {w: train(f"{name}-{w}", ranks, args + ["--train.max_steps", "30", "--parallel.zero",
                                                    "2", "--checkpoint.writer", w])
            for w in ("parallel", "rank0")}
    for step in (10, 20):
        ck = {w: os.path.join(runs[w], "checkpoints", f"ckpt-{step:09d}.h5") for w in runs}
        (a, aa), (b, ba) = contents(ck["parallel"]), contents(ck["rank0"])
        same = a.keys() == b.keys() and all(
            a[k][0].dtype == b[k][0].dtype and np.array_equal(a[k][0], b[k][0]) and a[k][1] == b[k][1]
            for k in a)
        crc_ok = all(zlib.crc32(np.ascontiguousarray(v).astype("<f4").tobytes()) == c
                     for v, c in a.values())
        print(f"{name} step {step}: {len(a)} datasets, parallel vs rank0 bitwise with equal CRCs: "
              f"{same}; every CRC the dataset's: {crc_ok}; root attributes equal: {aa == ba}")
        check(same, f"{name} step {step}: the parallel file's tensors or CRCs differ from rank 0's")
        check(crc_ok, f"{name} step {step}: a combined CRC is not its tensor's CRC-32")
        check(aa == ba, f"{name} step {step}: root attributes differ: "
                        f"{ {k for k in aa if aa.get(k) != ba.get(k)} }")
    ck20 = os.path.join(runs["parallel"], "checkpoints", "ckpt-000000020.h5")
    same_grid = train(f"{name}-resume", ranks, args + ["--train.max_steps", "30", "--parallel.zero",
                                                        "2", "--resume", ck20])
    pa = parameters(os.path.join(same_grid, "model.h5"))
    pb = parameters(os.path.join(runs["parallel"], "model.h5"))
    ok = pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)
    print(f"{name}: the parallel step-20 checkpoint resumed on its grid to step 30: model.h5 "
          f"bitwise: {ok}")
    check(ok, f"{name}: resumed from the parallel checkpoint, model.h5 not bitwise")
    one = train(f"{name}-one-rank", 1, model + ["--train.max_steps", "30", "--resume", ck20])
    got, ref = losses(os.path.join(one, "metrics.jsonl")), losses(os.path.join(runs["parallel"], "metrics.jsonl"))[20:]
    dl = float(np.max(np.abs(got - ref) / np.abs(ref))) if len(got) == len(ref) else float("inf")
    print(f"{name}: resumed on one rank: losses 21-30 within {dl:.2e} relative")
    check(dl <= 1e-6, f"{name}: one-rank resume {dl:.2e} relative")
sys.exit(check.finish())
