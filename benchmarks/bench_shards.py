#!/usr/bin/python3
"""Peak memory of training on token shards does not grow with the shards' total size.

Writes two sets of llm.c token shards (random uint16 ids below 4096): a large one
(--gb, default 2.0 GB, in shards of --shard_mb) and a small one (16 MB, two shards), then trains
the same short run on each (a 2-block GPT, dim 128, vocabulary 4096, context 256, global batch
8, one rank, one thread), --repeats times alternating, and prints the median peak RSS of each (the
child's ru_maxrss) and its wall time. Two loader settings: STRATA_DATA_CACHE_MB=0 (every split
streamed a batch ahead) and the default (a split within 512 MiB is read into memory once; the
large one is streamed). Also prints the start-up time of each (the done event's
lost_startup_s: before the first step, which includes checking every token against the
vocabulary), whose difference is the time to validate the large set. What does grow with the
data is the loader's shuffled order of one epoch, 8 bytes per window (as for HDF5 token files;
no token is held): printed beside each set, and subtracted in the last column. The shards are
written under --dir and removed at the end.

Usage: bench_shards.py [--strata build/strata] [--gb 2.0] [--shard_mb 100] [--repeats 3]
                       [--steps 30] [--dir DIR]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

# Token ids below 4096 and model.vocab = 4096: a small model keeps the run's own memory small,
# so memory that grew with the shards would show (GPT-2's 50257 adds only a larger table).
VOCAB = 4096
CONTEXT = 256


def write_shards(folder, total_tokens, shard_tokens, seed):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    header = np.zeros(256, np.int32)
    i = 0
    for first in range(0, total_tokens, shard_tokens):
        n = min(shard_tokens, total_tokens - first)
        header[:3] = (20240520, 1, n)
        with open(os.path.join(folder, f"bench_train_{i:06d}.bin"), "wb") as f:
            f.write(header.tobytes())
            f.write(rng.integers(0, VOCAB, n, dtype=np.uint16).tobytes())
        i += 1
    return os.path.join(folder, "bench_train_*.bin"), i


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.environ.get("STRATA_BIN", "build/strata"))
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--shard_mb", type=float, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_shards.", dir=a.dir)
    try:
        t0 = time.perf_counter()
        big, nbig = write_shards(os.path.join(work, "big"), int(a.gb * 1e9 / 2),
                                 int(a.shard_mb * 1e6 / 2), 1)
        small, nsmall = write_shards(os.path.join(work, "small"), 8_000_000, 4_000_000, 2)
        print(f"wrote {nbig} shards of {a.gb:.2f} GB and {nsmall} of 0.016 GB in "
              f"{time.perf_counter() - t0:.1f} s")
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        print(f"CPU: {cpu}, {os.cpu_count()} cores; strata: {a.strata}; {a.steps} steps, "
              f"median of {a.repeats}")
        sets = {"small (16 MB)": small, f"large ({a.gb:.1f} GB)": big}
        tokens = {"small (16 MB)": 8_000_000, f"large ({a.gb:.1f} GB)": int(a.gb * 1e9 / 2)}
        order_mib = {s: (n - 1) // CONTEXT * 8 / 2**20 for s, n in tokens.items()}
        modes = {"streamed (STRATA_DATA_CACHE_MB=0)": {"STRATA_DATA_CACHE_MB": "0"}, "default cache": {}}
        rss = {(s, m): [] for s in sets for m in modes}
        wall = {(s, m): [] for s in sets for m in modes}
        start = {s: [] for s in sets}
        for _ in range(a.repeats):
            for s, path in sets.items():
                for m, env in modes.items():
                    w, usage, startup = run_rusage(a.strata, path, a.steps, env, work)
                    rss[(s, m)].append(usage / 1024)
                    wall[(s, m)].append(w)
                    start[s].append(startup)
        names = list(sets)
        for m in modes:
            print(f"\n{m}")
            print(f"{'shard set':<18} {'peak RSS MiB':>13} {'wall s':>8} {'epoch order MiB':>16} "
                  f"{'RSS - order MiB':>16}")
            for s in names:
                r = statistics.median(rss[(s, m)])
                print(f"{s:<18} {r:>13.1f} {statistics.median(wall[(s, m)]):>8.2f} "
                      f"{order_mib[s]:>16.1f} {r - order_mib[s]:>16.1f}")
            big_r, small_r = (statistics.median(rss[(s, m)]) for s in names[::-1])
            print(f"large / small peak RSS: {big_r / small_r:.3f}; less the epoch order: "
                  f"{(big_r - order_mib[names[1]]) / (small_r - order_mib[names[0]]):.3f}")
        small_s, large_s = (statistics.median(start[s]) for s in names)
        print(f"\nstart-up (before the first step): small {small_s:.2f} s, large {large_s:.2f} s; "
              f"validating the large set takes about {large_s - small_s:.2f} s "
              f"({a.gb / max(large_s - small_s, 1e-3):.1f} GB/s, all cores)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_rusage(strata, shards, steps, env, work):
    """(wall seconds, peak RSS in KiB, start-up seconds) of one training run."""
    out = os.path.join(work, "out")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [strata, "train", "--quiet", "--threads", "1", "--data.path", shards, "--output.dir", out,
           "--model.type", "gpt", "--model.layers", "2", "--model.heads", "4", "--model.dim", "128",
           "--model.context", str(CONTEXT), "--model.vocab", str(VOCAB), "--train.batch_size", "8",
           "--train.max_steps", str(steps),
           "--train.optimizer", "adamw", "--train.lr", "0.0003", "--checkpoint.final", "false"]
    e = dict(os.environ)
    e.pop("STRATA_DATA_CACHE_MB", None)
    e.update(env)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed: {p.stderr.read().decode()[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        done = [json.loads(x) for x in f if '"done"' in x][-1]
    return wall, usage.ru_maxrss, done["lost_startup_s"]


if __name__ == "__main__":
    main()
