#!/usr/bin/python3
"""Token shards (llm.c's and nanoGPT's) train exactly as the same tokens in an HDF5 token file.

The first 2,049 train tokens (128 windows of context 16: the 16 steps of global batch 8 read
each exactly once) and 6,000 validation tokens of the fortunes token file, written three ways:
an HDF5 token file (uint8, as `strata prepare text` writes them), llm.c shards (1024-byte
header, uint16) cut at places that are not multiples of the context, so that windows span two
and three shards, and nanoGPT's train.bin / val.bin. A 1-block GPT trains on each, and every
validation window is evaluated at the end (the validation shards are cut likewise):
  - llm.c shards, in memory and streamed (STRATA_DATA_CACHE_MB=0), given as a glob, and nanoGPT
    train.bin: the losses, the validation loss and model.h5's parameters bitwise those of the
    HDF5 file;
  - resume across a shard boundary on a changed grid: a checkpoint written at step 8 by one
    rank, resumed on 2 ranks, continues bitwise as the same resume from the HDF5 file, and,
    with the weights frozen (lr 1e-30, so a step's loss depends only on its batch), its losses
    after the resume are bitwise those of an uninterrupted 2-rank run: the same tokens, in the
    same order, at the same place.

Usage: token_shards.py STRATA FORTUNES.h5 WORKDIR
"""
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from common import Checks, fresh_dir, metrics, run_checked, strata_cmd  # noqa: E402

STRATA, FORTUNES, WORK = sys.argv[1:4]
WORK = fresh_dir(WORK, "token-shards")
T, STEPS = 16, 16
check = Checks()


with h5py.File(FORTUNES, "r") as f:
    train = f["train/tokens"][:T * 8 * STEPS + 1]
    val = f["val/tokens"][:6000]
    vocab = int(f.attrs["vocab"])

h5 = os.path.join(WORK, "tokens.h5")
with h5py.File(h5, "w") as f:
    f.attrs["kind"] = "tokens"
    f.attrs["vocab"] = vocab
    f["train/tokens"] = train
    f["val/tokens"] = val


def write_llmc(path, tokens):
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def cut(tokens, sizes):
    """tokens in pieces of these sizes, the rest in a last piece."""
    edges = np.cumsum(sizes)
    return np.split(tokens, edges)


llmc = os.path.join(WORK, "llmc")
os.makedirs(llmc)
train_parts = cut(train, [301, 13, 700, 3, 50])  # 13 and 3 tokens: windows span 3 shards
val_parts = cut(val, [1000, 7, 2500])
for i, p in enumerate(train_parts):
    write_llmc(os.path.join(llmc, f"tiny_train_{i:06d}.bin"), p)
for i, p in enumerate(val_parts):
    write_llmc(os.path.join(llmc, f"tiny_val_{i:06d}.bin"), p)
edges = np.cumsum([len(p) for p in train_parts])[:-1]
spanning = sum(1 for w in range((len(train) - 1) // T) if any(w * T < e < w * T + T + 1 for e in edges))
print(f"llm.c: {len(train_parts)} train shards ({', '.join(str(len(p)) for p in train_parts)} "
      f"tokens), {spanning} of {(len(train) - 1) // T} train windows span two or more shards; "
      f"{len(val_parts)} validation shards")

nano = os.path.join(WORK, "nanogpt")
os.makedirs(nano)
train.astype("<u2").tofile(os.path.join(nano, "train.bin"))
val.astype("<u2").tofile(os.path.join(nano, "val.bin"))

MODEL = ["--model.type", "gpt", "--model.layers", "1", "--model.heads", "2", "--model.dim", "16",
         "--model.context", str(T), "--model.vocab", str(vocab), "--train.optimizer", "adamw",
         "--train.lr", "0.003", "--train.batch_size", "8", "--train.seed", "3",
         "--train.log_every", "1", "--quiet"]


def train_run(tag, data, ranks=1, extra=(), env=None, steps=STEPS):
    out = os.path.join(WORK, tag)
    cmd = strata_cmd(STRATA, ranks) + ["train", "--data.path", data, "--output.dir", out,
                                       "--train.max_steps", str(steps)] + MODEL + list(extra)
    run_checked(cmd, env=env, timeout=300)
    ms = metrics(os.path.join(out, "metrics.jsonl"))
    losses = [m["loss"] for m in ms if "event" not in m]
    done = [m for m in ms if m.get("event") == "done"]
    return out, losses, done[-1] if done else {}


def params(out):
    got = {}
    with h5py.File(os.path.join(out, "model.h5"), "r") as f:
        f["params"].visititems(lambda n, o: got.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return got


def same_params(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


ref_out, ref, ref_done = train_run("hdf5", h5)
check(len(ref) == STEPS and ref[-1] < ref[0], f"the HDF5 run logged losses {ref}")
check("test_loss" in ref_done, "the HDF5 run evaluated no validation split")
print(f"HDF5 token file: loss {ref[0]:.6f} -> {ref[-1]:.6f}, validation loss {ref_done.get('test_loss')}")
ref_params = params(ref_out)

shards = os.path.join(llmc, "tiny_train_*.bin")
for tag, data, env in (("llm.c shards (glob, in memory)", shards, None),
                       ("llm.c shards (glob, streamed)", shards, {"STRATA_DATA_CACHE_MB": "0"}),
                       ("nanoGPT train.bin", os.path.join(nano, "train.bin"), None)):
    out, ls, done = train_run(tag.split()[0] + str(len(env or {})), data, env=env)
    same_loss = ls == ref
    same_val = done.get("test_loss") == ref_done.get("test_loss")
    same_p = same_params(params(out), ref_params)
    check(same_loss, f"{tag}: losses {ls} differ from the HDF5 file's {ref}")
    check(same_val, f"{tag}: validation loss {done.get('test_loss')} vs {ref_done.get('test_loss')}")
    check(same_p, f"{tag}: model.h5 parameters differ from the HDF5 run's")
    print(f"{tag}: {STEPS} losses {'bitwise equal' if same_loss else 'DIFFER'}, validation loss "
          f"{'bitwise equal' if same_val else 'DIFFERS'}, model.h5 parameters "
          f"{'bitwise equal' if same_p else 'DIFFER'}")

# Resume across a shard boundary on a changed grid: written at step 8 by one rank, resumed by 2.
K = STEPS // 2
ckpt = ["--checkpoint.every_steps", str(K), "--checkpoint.keep_last", "2"]


def interrupted(tag, lr):
    out, _, _ = train_run(tag, shards, extra=ckpt + ["--train.lr", lr], steps=K)
    return os.path.join(out, "checkpoints", f"ckpt-{K:09d}.h5")


def resumed(tag, data, ck, lr):
    return train_run(tag, data, ranks=2, extra=["--resume", ck, "--train.lr", lr])[1]


ck = interrupted("stop-1rank", "0.003")
on_shards = resumed("resume-2ranks-shards", shards, ck, "0.003")
on_h5 = resumed("resume-2ranks-hdf5", h5, ck, "0.003")
check(len(on_shards) == STEPS - K, f"the resumed run logged {len(on_shards)} losses")
check(on_shards == on_h5, f"resumed on 2 ranks: shards {on_shards} vs HDF5 {on_h5}")
worst = max(abs(a - b) / b for a, b in zip(on_shards, ref[K:]))
check(worst < 1e-5, f"resumed on 2 ranks: {worst:.2e} relative from the uninterrupted 1-rank run")
print(f"checkpoint of step {K} (1 rank) resumed on 2 ranks: losses {'bitwise' if on_shards == on_h5 else 'NOT'} "
      f"those of the same resume from the HDF5 file; {worst:.1e} relative from the uninterrupted "
      f"1-rank run (another grid: fp32 rounding)")

frozen_ck = interrupted("frozen-stop-1rank", "1e-30")
frozen_resumed = resumed("frozen-resume-2ranks", shards, frozen_ck, "1e-30")
_, frozen_whole, _ = train_run("frozen-whole-2ranks", shards, ranks=2, extra=["--train.lr", "1e-30"])
same = frozen_resumed == frozen_whole[K:]
check(same, f"frozen weights: resumed losses {frozen_resumed} vs uninterrupted {frozen_whole[K:]}")
check(len(set(frozen_whole)) == len(frozen_whole), "frozen weights: batches give equal losses, so "
      "the comparison could not see a batch out of place")
print(f"frozen weights, 1 rank to step {K} then 2 ranks: losses of steps {K + 1}-{STEPS} "
      f"{'bitwise' if same else 'NOT'} those of the uninterrupted 2-rank run")
check.finish()
