#!/usr/bin/python3
"""Two builds of strata give bitwise-identical results: for a refactoring that must change no
behaviour. Runs each build on the same matrix of runs and compares every dataset of the
parameter file and of the last checkpoint, byte for byte.

Usage: bitwise_vs_build.py OLD_STRATA NEW_STRATA --data FASHION.h5 --text FORTUNES.h5
                           [--work DIR] [--only NAME,...]

The matrix (small and short: each run is seconds):
  mlp-1rank            MLP, 1 rank (update in backward)
  cnn-dp2              CNN, 2 ranks data parallel
  deep-pipe-1f1b       deep MLP, 2-stage pipeline, 1f1b
  deep-pipe-gpipe      the same, gpipe
  gpt-tp2              GPT, 2 ranks tensor parallel
  gpt-pipe2            GPT, 2-stage pipeline
  cnn-resume           CNN stopped after 3 steps (max_steps), resumed to 6 from its checkpoint
  mlp-staged           MLP on --device cpu-staged (the GPU path's copies on host memory)
  gpt-zero2-dp2        GPT, 2 ranks data parallel, ZeRO-2, gradient clipping (shards of the norm)
  gpt-zero1-pipe2x2    GPT, 2 stages x 2 replicas, ZeRO-1
  deep-pipe-zbh1       deep MLP, 2-stage pipeline, zb-h1 (backward split into B and W)
  deep-pipe-interleaved  deep MLP, 2 stages x 2 chunks, interleaved 1F1B
  gpt-bf16             GPT in bf16 (where the CPU has native bf16 GEMMs; else skipped)
  gpt-staged-pipe2     GPT, 2-stage pipeline on --device cpu-staged (the tied table's sum)
  gpt-micro4           GPT, 1 rank, 4 micro-batches
  gpt-bf16-micro4      the same in bf16 with recomputed blocks (where the CPU has bf16 GEMMs)
Exit 0 when every dataset of every run is identical; otherwise each difference is listed.
"""
import argparse
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "..", "configs")


def matrix(data, text):
    img = ["--data.path", data, "--train.log_every", "1"]
    tiny_cnn = img + ["--config", f"{CONFIGS}/fmnist_cnn.toml", "--model.channels", "8", "16",
                      "--model.hidden", "32", "--train.batch_size", "32"]
    deep = img + ["--config", f"{CONFIGS}/fmnist_deep_mlp_pipeline.toml", "--model.hidden",
                  "64", "64", "64", "64", "--train.batch_size", "64", "--parallel.microbatches", "4"]
    gpt = ["--config", f"{CONFIGS}/gpt_fortunes.toml", "--data.path", text, "--model.layers", "2",
           "--model.dim", "64", "--train.batch_size", "8", "--model.context", "32",
           "--train.log_every", "1"]
    # Wide enough for the linear layers' forward to run on the matmul primitive.
    gpt_wide = gpt + ["--model.dim", "128", "--model.context", "64"]
    ckpt = ["--checkpoint.every_steps", "2"]
    return {
        "mlp-1rank": [(1, img + ["--config", f"{CONFIGS}/fmnist_mlp.toml", "--train.max_steps", "6"] + ckpt)],
        "cnn-dp2": [(2, tiny_cnn + ["--train.max_steps", "6"] + ckpt)],
        "deep-pipe-1f1b": [(2, deep + ["--train.max_steps", "6", "--parallel.schedule", "1f1b"] + ckpt)],
        "deep-pipe-gpipe": [(2, deep + ["--train.max_steps", "6", "--parallel.schedule", "gpipe"] + ckpt)],
        "gpt-tp2": [(2, gpt + ["--train.max_steps", "6", "--parallel.tensor", "2"] + ckpt)],
        "gpt-pipe2": [(2, gpt + ["--train.max_steps", "6", "--parallel.pipeline_stages", "2"] + ckpt)],
        "cnn-resume": [(1, tiny_cnn + ["--train.max_steps", "3", "--checkpoint.every_steps", "3"]),
                       (1, tiny_cnn + ["--train.max_steps", "6", "--checkpoint.every_steps", "3",
                                       "--resume", "auto"])],
        "mlp-staged": [(1, img + ["--config", f"{CONFIGS}/fmnist_mlp.toml", "--train.max_steps", "6",
                                  "--device", "cpu-staged"] + ckpt)],
        "gpt-zero2-dp2": [(2, gpt + ["--train.max_steps", "6", "--parallel.zero", "2"] + ckpt)],
        "gpt-zero1-pipe2x2": [(4, gpt + ["--train.max_steps", "6", "--parallel.zero", "1",
                                         "--parallel.pipeline_stages", "2"] + ckpt)],
        "deep-pipe-zbh1": [(2, deep + ["--train.max_steps", "6", "--parallel.schedule", "zb-h1"] + ckpt)],
        "deep-pipe-interleaved": [(2, deep + ["--train.max_steps", "6", "--parallel.schedule",
                                               "interleaved", "--parallel.virtual_stages", "2"] + ckpt)],
        "gpt-bf16": [(1, gpt + ["--train.max_steps", "6", "--train.precision", "bf16"] + ckpt)],
        "gpt-staged-pipe2": [(2, gpt + ["--train.max_steps", "6", "--parallel.pipeline_stages", "2",
                                        "--device", "cpu-staged"] + ckpt)],
        "gpt-micro4": [(1, gpt_wide + ["--train.max_steps", "6", "--parallel.microbatches", "4"] + ckpt)],
        "gpt-bf16-micro4": [(1, gpt_wide + ["--train.max_steps", "6", "--parallel.microbatches", "4",
                                           "--train.recompute", "block", "--train.precision", "bf16"] + ckpt)],
    }


def run(strata, out, steps):
    os.makedirs(out, exist_ok=True)
    for ranks, args in steps:
        cmd = [strata, "train"] + args + ["--output.dir", out, "--quiet", "--threads", "1"]
        if ranks > 1:
            cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
        p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-3000:]}")


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def last_checkpoint(out):
    d = os.path.join(out, "checkpoints")
    names = sorted(n for n in os.listdir(d) if n.startswith("ckpt-") and n.endswith(".h5"))
    return os.path.join(d, names[-1])


def compare(a, b, what):
    da, db = datasets(a), datasets(b)
    problems = []
    if da.keys() != db.keys():
        problems.append(f"{what}: datasets differ: {sorted(da.keys() ^ db.keys())}")
    for name in sorted(da.keys() & db.keys()):
        x, y = np.asarray(da[name]), np.asarray(db[name])
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64)).max() if x.shape == y.shape else "shape"
            problems.append(f"{what}: /{name} differs (max abs diff {diff})")
    return problems, len(da)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--data", required=True, help="Fashion-MNIST in strata's layout")
    ap.add_argument("--text", required=True, help="a token file (strata prepare text)")
    ap.add_argument("--work", default="/tmp/strata-bitwise")
    ap.add_argument("--only", default="", help="comma-separated run names")
    a = ap.parse_args()
    runs = matrix(os.path.abspath(a.data), os.path.abspath(a.text))
    if a.only:
        runs = {k: v for k, v in runs.items() if k in a.only.split(",")}
    shutil.rmtree(a.work, ignore_errors=True)
    failures = []
    flags = open("/proc/cpuinfo").read()
    for name, steps in runs.items():
        if "bf16" in name and "avx512_bf16" not in flags and "amx_bf16" not in flags:
            print(f"{name}: skipped: this CPU has no native bf16 GEMMs (avx512_bf16 or amx_bf16)")
            continue
        outs = []
        for tag, strata in (("old", a.old), ("new", a.new)):
            out = os.path.join(a.work, name, tag)
            run(strata, out, steps)
            outs.append(out)
        problems, n1 = compare(*(os.path.join(o, "model.h5") for o in outs), f"{name} model.h5")
        more, n2 = compare(*(last_checkpoint(o) for o in outs), f"{name} {os.path.basename(last_checkpoint(outs[0]))}")
        problems += more
        failures += problems
        print(f"{name}: {'identical' if not problems else 'DIFFERENT'} ({n1} datasets in model.h5, "
              f"{n2} in {os.path.basename(last_checkpoint(outs[0]))})")
        for p in problems:
            print("  " + p)
    print(f"{len(runs) - len({f.split(' ')[0] for f in failures})} of {len(runs)} runs identical "
          f"(skipped ones counted as such above)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
