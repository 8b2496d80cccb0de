#!/usr/bin/env python3
"""Checkpoint speed: strata's checkpoint write and read bandwidth beside `dd conv=fsync` on the
same disk, in the same run, and the training-step stall a checkpoint causes.

  benchmarks/bench_checkpoint.py [--strata build/strata] [--data data/fashion-mnist.h5]
                                 [--dir /var/tmp/strata-bench-ckpt] [--repeats 3]

The model is an MLP 784-4096-4096-2048-10 (28.4 M parameters): a checkpoint of parameters plus
SGD momentum is 227 MB. Each repeat trains 13 steps with a checkpoint every 4 (3 checkpoints),
written in the background (checkpoint.async, the default; pass --sync for checkpoint.async=false),
then `strata inspect` reads the newest checkpoint back and verifies every CRC, then dd writes
and reads a file of the same size. Reads are cold (page cache dropped) when this process may
write /proc/sys/vm/drop_caches, warm otherwise; the report says which.
Target (issue 3): write bandwidth >= 60% of dd's."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--strata", default="build/strata")
ap.add_argument("--data", default="data/fashion-mnist.h5")
ap.add_argument("--dir", default="/var/tmp/strata-bench-ckpt")
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--sync", action="store_true", help="checkpoint.async = false")
a = ap.parse_args()


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd(args):
    r = subprocess.run(["dd"] + args, capture_output=True, text=True, check=True)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", r.stderr)
    return int(m.group(1)) / float(m.group(2)) / 1e6


shutil.rmtree(a.dir, ignore_errors=True)
os.makedirs(a.dir)
rows = []
cold = False
for rep in range(a.repeats):
    run_dir = os.path.join(a.dir, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [a.strata, "train", "--data.path", a.data, "--model.hidden", "4096", "4096", "2048",
           "--train.max_steps", "13", "--train.log_every", "1", "--checkpoint.every_steps", "4",
           "--checkpoint.keep_last", "2", "--checkpoint.final", "false", "--output.dir", run_dir,
           "--progress", "off", "--threads", "1", "--checkpoint.async", "false" if a.sync else "true"]
    subprocess.run(cmd, check=True, capture_output=True)
    ms = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    ckpts = [m for m in ms if m.get("event") == "checkpoint"]
    steps = [m for m in ms if "event" not in m]
    # Step durations from the elapsed times; a checkpoint is written inside its step's time.
    dur = {s["step"]: s["time_s"] - p["time_s"] for p, s in zip(steps, steps[1:])}
    ck_steps = {c["step"] for c in ckpts}
    plain = [d for s, d in dur.items() if s not in ck_steps]
    with_ck = [d for s, d in dur.items() if s in ck_steps]
    size = ckpts[-1]["bytes"]
    write_mb_s = statistics.median(c["mb_per_s"] for c in ckpts)
    write_s = statistics.median(c["write_s"] for c in ckpts)
    newest = ckpts[-1]["path"]
    cold = drop_caches()
    r = subprocess.run([a.strata, "inspect", newest], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"strata inspect failed:\n{r.stdout}{r.stderr}")
    # strata's own timing of open + read + CRC check (not process start-up).
    read_s = float(re.search(r"read and verified in ([\d.]+) s", r.stdout).group(1))
    dd_file = os.path.join(a.dir, "dd.bin")
    mb = (size + 2**20 - 1) // 2**20
    dd_w = dd(["if=/dev/zero", f"of={dd_file}", "bs=1M", f"count={mb}", "conv=fsync"])
    drop_caches()
    dd_r = dd([f"if={dd_file}", "of=/dev/null", "bs=1M"])
    os.remove(dd_file)
    row = dict(size_mb=size / 1e6, write_mb_s=write_mb_s, dd_write_mb_s=dd_w,
               read_mb_s=size / 1e6 / read_s, dd_read_mb_s=dd_r, write_s=write_s,
               step_s=statistics.median(plain), stall_s=statistics.median(with_ck) - statistics.median(plain),
               snapshot_s=statistics.median(c["stall_s"] for c in ckpts))
    rows.append(row)
    print(f"repeat {rep + 1}: checkpoint {row['size_mb']:.0f} MB written at {write_mb_s:.0f} MB/s "
          f"(dd {dd_w:.0f} MB/s), read+verified at {row['read_mb_s']:.0f} MB/s (dd {dd_r:.0f} MB/s); "
          f"step {row['step_s']:.3f} s, step with checkpoint +{row['stall_s']:.3f} s", flush=True)

med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
ratio_w = med["write_mb_s"] / med["dd_write_mb_s"]
print(f"\nmedian of {a.repeats} ({'cold' if cold else 'WARM (cannot drop caches)'} reads), disk of {a.dir}:")
print(f"  checkpoint size       {med['size_mb']:.0f} MB (parameters + SGD momentum, 28.4 M parameters)")
print(f"  write                 {med['write_mb_s']:.0f} MB/s   dd conv=fsync {med['dd_write_mb_s']:.0f} MB/s   "
      f"ratio {ratio_w:.2f} (target >= 0.60: {'met' if ratio_w >= 0.6 else 'NOT met'})")
print(f"  read + CRC verify     {med['read_mb_s']:.0f} MB/s   dd {med['dd_read_mb_s']:.0f} MB/s   "
      f"ratio {med['read_mb_s'] / med['dd_read_mb_s']:.2f}")
print(f"  training step         {med['step_s']:.3f} s; a step that starts a checkpoint takes "
      f"{med['stall_s']:.3f} s longer (time in save(): {med['snapshot_s']:.3f} s; the write itself "
      f"{med['write_s']:.3f} s{'' if a.sync else ', in the background'})")
shutil.rmtree(a.dir, ignore_errors=True)
