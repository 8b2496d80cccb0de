#!/usr/bin/env python3
"""The training stall of checkpoints with checkpoint.local_dir against without it, when the
shared checkpoint directory is slow (issue 17).

  benchmarks/bench_local_cache.py [--strata build/strata] [--data data/fashion-mnist.h5]
      [--mbps 20] [--steps 41] [--every 8] [--work /var/tmp/strata-bench-local-cache]

The "shared file system" is an ext4 file system on a loop device whose reads and writes are
throttled by the block-I/O controller (cgroup v1 blkio.throttle.*_bps_device in the root
group, or cgroup v2 io.max where the io controller is enabled) to --mbps MB/s: every byte
strata writes there, and reads back to verify, passes through the throttle as it would through
a busy network file system, while the page cache in front behaves as it does for a local one.
The node-local directory is on this machine's own disk. A `dd conv=fsync` to each, first,
shows the two speeds in the same run. Needs root (losetup, mount, the cgroup files).

Four runs of the MLP 784-4096-4096-2048-10 (28.4 M parameters, a 227 MB checkpoint), one
rank: checkpoint.async true and false, each without and with checkpoint.local_dir, a
checkpoint every --every steps. Reported: the training thread's stall in periodic checkpoints
(strata's goodput ledger: lost_checkpoint_stall_s, less the final checkpoint's), per
checkpoint and in all, the final checkpoint's stall (with the cache it waits until the copy
reached the shared directory), training samples/s, and how many checkpoints reached the
shared directory (the copier skips those a newer one overtook)."""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ap = argparse.ArgumentParser()
ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
ap.add_argument("--data", default=os.path.join(ROOT, "data", "fashion-mnist.h5"))
ap.add_argument("--work", default="/var/tmp/strata-bench-local-cache")
ap.add_argument("--mbps", type=float, default=20)
ap.add_argument("--steps", type=int, default=41)
ap.add_argument("--every", type=int, default=8)
a = ap.parse_args()


def run(*cmd, **kw):
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kw)


class SlowDisk:
    """An ext4 on a loop device, reads and writes throttled to `mbps`."""

    def __init__(self, work, mbps):
        self.image, self.mnt = os.path.join(work, "shared.img"), os.path.join(work, "shared")
        os.makedirs(self.mnt, exist_ok=True)
        run("truncate", "-s", "4G", self.image)
        self.loop = run("losetup", "-f", "--show", self.image).stdout.strip()
        run("mkfs.ext4", "-q", self.loop)
        run("mount", self.loop, self.mnt)
        self.dev = run("lsblk", "-no", "MAJ:MIN", self.loop).stdout.strip()
        bps = int(mbps * 1e6)
        v2 = "/sys/fs/cgroup/io.max"
        if os.path.exists(v2):
            self.files = [(v2, f"{self.dev} rbps={bps} wbps={bps}", f"{self.dev} rbps=max wbps=max")]
            self.how = f"cgroup v2 io.max {self.dev} rbps=wbps={bps}"
        else:
            base = "/sys/fs/cgroup/blkio/blkio.throttle."
            self.files = [(base + k + "_bps_device", f"{self.dev} {bps}", f"{self.dev} 0") for k in ("read", "write")]
            self.how = f"cgroup v1 blkio.throttle.{{read,write}}_bps_device {self.dev} {bps} (root group)"
        for path, on, _ in self.files:
            with open(path, "w") as f:
                f.write(on)

    def close(self):
        for path, _, off in self.files:
            with open(path, "w") as f:
                f.write(off)
        subprocess.run(["umount", self.mnt])
        subprocess.run(["losetup", "-d", self.loop])
        os.remove(self.image)


def dd_write_mb_s(path):
    r = run("dd", "if=/dev/zero", f"of={path}", "bs=1M", "count=200", "conv=fsync")
    os.remove(path)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", r.stderr)
    return int(m.group(1)) / float(m.group(2)) / 1e6


def train(name, shared, local, sync):
    out = os.path.join(shared, name)
    shutil.rmtree(out, ignore_errors=True)
    if local:
        shutil.rmtree(local, ignore_errors=True)
    cmd = [a.strata, "train", "--data.path", a.data, "--model.hidden", "4096", "4096", "2048",
           "--train.max_steps", str(a.steps), "--train.log_every", "1",
           "--checkpoint.every_steps", str(a.every), "--checkpoint.keep_last", "2",
           "--checkpoint.async", "false" if sync else "true", "--output.dir", out,
           "--output.metrics", os.path.join(a.work, name + ".jsonl"), "--progress", "off", "--threads", "1"]
    if local:
        cmd += ["--checkpoint.local_dir", local]
    if os.path.exists(cmd[cmd.index("--output.metrics") + 1]):
        os.remove(cmd[cmd.index("--output.metrics") + 1])
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    ms = [json.loads(l) for l in open(cmd[cmd.index("--output.metrics") + 1])]
    done = [m for m in ms if m.get("event") == "done"][-1]
    ckpts = [m for m in ms if m.get("event") == "checkpoint"]
    steps = {m["step"]: m["time_s"] for m in ms if "event" not in m}
    final = [c for c in ckpts if c["step"] == a.steps]
    # The final checkpoint is written after the last step's metrics line: its stall is the time
    # from that line to the done event's train_time_s.
    final_stall = done["train_time_s"] - steps[a.steps]
    periodic = done["lost_checkpoint_stall_s"] - final_stall
    n_periodic = len([c for c in ckpts if c["step"] != a.steps])
    shared_ckpts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "checkpoints", "ckpt-*.h5")))
    return {"name": name, "periodic_stall_s": periodic, "periodic": n_periodic,
            "final_stall_s": final_stall, "samples_per_s": done["samples_per_s"],
            "train_time_s": done["train_time_s"], "wall_s": wall, "shared": shared_ckpts,
            "bytes": final[0]["bytes"] if final else ckpts[-1]["bytes"]}


def main():
    if os.geteuid() != 0:
        sys.exit("needs root (losetup, mount, cgroup throttling)")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    cpu = re.search(r"Model name:\s*(.*)", run("lscpu").stdout)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} CPU {cpu.group(1) if cpu else '?'}, {os.cpu_count()} cores")
    disk = SlowDisk(a.work, a.mbps)
    try:
        local_root = os.path.join(a.work, "local")
        os.makedirs(local_root)
        print(f"shared: {disk.mnt} (ext4 on {disk.loop}, {disk.how}); local: {local_root}")
        print(f"dd 200 MB conv=fsync: shared {dd_write_mb_s(os.path.join(disk.mnt, 'dd')):.1f} MB/s, "
              f"local {dd_write_mb_s(os.path.join(local_root, 'dd')):.1f} MB/s")
        rows = []
        for sync in (False, True):
            for local in (None, os.path.join(local_root, "cache")):
                name = f"{'sync' if sync else 'async'}-{'local' if local else 'shared'}"
                r = train(name, disk.mnt, local, sync)
                rows.append(r)
                print(f"{name:13}: periodic checkpoints stall {r['periodic_stall_s']:6.2f} s in all, "
                      f"{r['periodic_stall_s'] / max(r['periodic'], 1):5.2f} s each ({r['periodic']}); final "
                      f"{r['final_stall_s']:5.2f} s; {r['samples_per_s']:6.0f} samples/s; in the shared "
                      f"directory: {', '.join(r['shared'])}", flush=True)
        mb = rows[0]["bytes"] / 1e6
        print(f"\ncheckpoint {mb:.0f} MB, every {a.every} steps, {a.steps} steps, shared directory at {a.mbps:g} MB/s")
        for mode in ("async", "sync"):
            no, yes = [r for r in rows if r["name"].startswith(mode)]
            print(f"{mode:5}: stall per periodic checkpoint {no['periodic_stall_s'] / max(no['periodic'], 1):.2f} s "
                  f"without local_dir, {yes['periodic_stall_s'] / max(yes['periodic'], 1):.2f} s with it "
                  f"({no['periodic_stall_s'] / max(yes['periodic_stall_s'], 1e-9):.1f}x less); training "
                  f"{no['train_time_s']:.1f} -> {yes['train_time_s']:.1f} s")
        with open(os.path.join(a.work, "results.json"), "w") as f:
            json.dump(rows, f, indent=1)
    finally:
        disk.close()


if __name__ == "__main__":
    main()
