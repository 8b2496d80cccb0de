#!/usr/bin/python3
"""Reduced precision on the CPU is as good as fp32 (issue 19): bf16 training, int8 inference.

Usage: precision.py STRATA DATA.h5 WORKDIR {mlp|cnn|gpt|resume}

  mlp, cnn  configs/fmnist_{mlp,cnn}.toml on one rank (the mlp in full, the cnn 2 of its 4 epochs), fp32 and bf16 at the same seed:
            test accuracies within 0.5 points. The fp32 model quantized (strata quantize:
            activations per row, and calibrated on 20 batches) and evaluated in int8: test
            accuracy at most 0.5 points below fp32's.
  gpt       configs/gpt_fortunes.toml (300 of its 600 steps) on the `art` fortunes, fp32 and bf16:
            validation losses within 1 %; int8 (per row): validation loss at most 2 % above
            fp32's; strata generate runs the int8 file.
  resume    a bf16 run's checkpoint resumed in fp32 and an fp32 one resumed in bf16, with
            `train.precision` the only change: both finish, the checkpoints hold fp32 tensors,
            and the resumed losses stay within bf16's rounding of the uninterrupted run's.

Each bf16 run's start-up line must name oneDNN's bf16 kernels. On a CPU without bf16
instructions the test exits 77 (ctest: skipped), after checking that strata refuses bf16 with
one line naming the instruction set.
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

from common import MPI_ENV, art_text, losses, metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fail(msg):
    sys.exit("FAIL: " + msg)


def cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def train(strata, out, args, precision, fresh=True):
    """strata train ARGS in `precision` into out/ (emptied first when fresh); the done event."""
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    cmd = [strata, "train", *args, "--train.precision", precision, "--threads", "1",
           "--device", "cpu", "--output.dir", out, "--checkpoint.dir", out + "/checkpoints",
           "--progress", "lines"]
    p = subprocess.run(cmd, env=MPI_ENV, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    # The start-up line (the `plan:` line of the memory estimate comes before it).
    first = next((l for l in (p.stdout + p.stderr).splitlines() if l.startswith("strata ")), "")
    if precision == "bf16" and "bf16" not in first.split("; bf16:", 1)[-1]:
        fail(f"the start-up line does not name the bf16 kernels: {first}")
    return [m for m in metrics(os.path.join(out, "metrics.jsonl")) if m.get("event") == "done"][-1]


def int8_eval(strata, params, data, out, calibrate=0):
    """strata quantize params (calibrated on `calibrate` batches of data), then strata eval."""
    cmd = [strata, "quantize", "--checkpoint", params, "--out", out]
    if calibrate:
        cmd += ["--calibrate", str(calibrate), "--data", data]
    p = subprocess.run(cmd, env=MPI_ENV, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-1000:]}")
    print("  " + p.stdout.strip().replace("\n", "\n  "))
    p = subprocess.run([strata, "eval", "--checkpoint", out, "--data", data, "--json"], env=MPI_ENV,
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        fail(f"strata eval of {out} exited {p.returncode}: {p.stderr[-1000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["precision"] != "int8":
        fail(f"strata eval of {out} ran {r['precision']}, not int8")
    return r


def accuracy(strata, data, work, model):
    args = ["--config", os.path.join(ROOT, "configs", f"fmnist_{model}.toml"), "--data.path", data]
    if model == "cnn":  # 2 of the config's 4 epochs, to keep the suite within CI's 20 minutes
        args += ["--train.epochs", "2"]
    acc = {p: train(strata, f"{work}/{model}-{p}", args, p)["test_accuracy"] for p in ("fp32", "bf16")}
    gap = abs(acc["bf16"] - acc["fp32"]) * 100
    print(f"{model}: test accuracy fp32 {acc['fp32']:.4f}, bf16 {acc['bf16']:.4f}: "
          f"{gap:.2f} points apart (at most 0.5)")
    if gap > 0.5:
        fail(f"{model}: bf16 is {gap:.2f} points from fp32")
    params = f"{work}/{model}-fp32/model.h5"
    for calibrate in (0, 20):
        r = int8_eval(strata, params, data, f"{work}/{model}-int8-{calibrate}.h5", calibrate)
        drop = (acc["fp32"] - r["accuracy"]) * 100
        print(f"{model}: int8 ({'calibrated on 20 batches' if calibrate else 'per row'}) test "
              f"accuracy {r['accuracy']:.4f}: {drop:+.2f} points below fp32 (at most 0.5)")
        if drop > 0.5:
            fail(f"{model}: int8 loses {drop:.2f} points")


def gpt(strata, work):
    # The first half of the shipped run (300 of its 600 steps): the two precisions have parted
    # by then if they are going to, and the suite stays within CI's time.
    args = ["--config", os.path.join(ROOT, "configs", "gpt_fortunes.toml"),
            "--data.path", art_text(strata, work), "--train.max_steps", "300"]
    val = {p: train(strata, f"{work}/gpt-{p}", args, p)["test_loss"] for p in ("fp32", "bf16")}
    rel = abs(val["bf16"] - val["fp32"]) / val["fp32"]
    print(f"gpt: validation loss fp32 {val['fp32']:.4f}, bf16 {val['bf16']:.4f}: "
          f"{rel * 100:.2f} % apart (at most 1 %)")
    if rel > 0.01:
        fail(f"gpt: bf16's validation loss is {rel * 100:.2f} % from fp32's")
    text = art_text(strata, work)
    int8 = f"{work}/gpt-int8.h5"
    r = int8_eval(strata, f"{work}/gpt-fp32/model.h5", text, int8)
    up = r["loss"] / val["fp32"] - 1
    print(f"gpt: int8 validation loss {r['loss']:.4f}: {up * 100:+.2f} % against fp32 (at most 2 %)")
    if up > 0.02:
        fail(f"gpt: int8 raises the validation loss by {up * 100:.2f} %")
    p = subprocess.run([strata, "generate", "--checkpoint", int8, "--tokens", "40", "--seed", "1",
                        "--prompt", "The "], env=MPI_ENV, capture_output=True, text=True, timeout=300)
    if p.returncode != 0 or len(p.stdout) < 44:
        fail(f"strata generate of the int8 file: exit {p.returncode}, {p.stdout!r} {p.stderr[-500:]}")


def resume(strata, data, work):
    args = ["--config", os.path.join(ROOT, "configs", "fmnist_mlp.toml"), "--data.path", data,
            "--train.epochs", "1", "--train.log_every", "10", "--checkpoint.every_steps", "400"]
    full = {p: f"{work}/resume-{p}" for p in ("fp32", "bf16")}
    for p, out in full.items():
        train(strata, out, args, p)
    for src, dst in (("bf16", "fp32"), ("fp32", "bf16")):
        ckpt = os.path.join(full[src], "checkpoints", "ckpt-000000400.h5")
        kinds = set()
        with h5py.File(ckpt, "r") as f:
            f.visititems(lambda n, o: kinds.add(o.dtype) if isinstance(o, h5py.Dataset)
                         and o.dtype.kind == "f" else None)
        if kinds != {np.dtype("float32")}:
            fail(f"{ckpt}: tensors of {kinds}, expected float32 only")
        out = f"{work}/resume-{src}-as-{dst}"
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out + "/checkpoints")
        shutil.copy(ckpt, out + "/checkpoints/")
        train(strata, out, args + ["--resume", "auto"], dst, fresh=False)
        got, ref = losses(out + "/metrics.jsonl"), losses(full[dst] + "/metrics.jsonl")
        if len(got) >= len(ref):
            fail(f"resuming {src}'s checkpoint in {dst}: {len(got)} logged steps, so it did not "
                 f"start at step 400 (the whole run logs {len(ref)})")
        # The resumed run logs steps 410.. of the same run: compare them with the uninterrupted
        # run in the new precision (the two differ from step 400 by one precision's rounding).
        n = len(got)
        rel = np.abs(got - ref[-n:]) / np.abs(ref[-n:])
        print(f"resume {src} -> {dst}: {n} logged losses within {rel.max():.3g} relative "
              f"(median {np.median(rel):.3g}) of the uninterrupted {dst} run")
        if np.median(rel) > 0.05:
            fail(f"resume {src} -> {dst}: losses {got} against {ref[-n:]}")


def main():
    strata, data, work, what = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    os.makedirs(work, exist_ok=True)
    if not cpu_has_bf16():
        p = subprocess.run([strata, "train", "--config", os.path.join(ROOT, "configs",
                            "fmnist_mlp.toml"), "--data.path", data, "--device", "cpu",
                            "--train.precision", "bf16", "--output.dir", work + "/refused"],
                           capture_output=True, text=True)
        if p.returncode != 2 or "avx512_bf16" not in p.stderr:
            fail(f"without bf16 instructions strata should refuse bf16 (exit 2, naming "
                 f"avx512_bf16); got {p.returncode}: {p.stderr}")
        print("skipped: this CPU has no bf16 instructions (strata refused bf16 as it should)")
        sys.exit(77)
    if what in ("mlp", "cnn"):
        accuracy(strata, data, work, what)
    elif what == "gpt":
        gpt(strata, work)
    elif what == "resume":
        resume(strata, data, work)
    else:
        fail(f"unknown part {what}")
    print("PASS")


if __name__ == "__main__":
    main()
