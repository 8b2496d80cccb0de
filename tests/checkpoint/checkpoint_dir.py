"""The checkpoint directory is checked before training starts (exit 2, one line naming it): not a
directory, read-only, too little space for one checkpoint. A directory that fills up during the run ends it with
exit 6 (model.h5 written, the checkpoints that were written intact). Files strata writes follow
the umask but are never world-writable. Usage: checkpoint_dir.py STRATA DATA WORKDIR
(The read-only and no-space cases mount small tmpfs file systems: they need root, and are
skipped with exit 77 where mounting is not allowed.)"""
import os
import stat
import subprocess
import sys

from ckpt_common import fail, fresh

strata, data, work = sys.argv[1], sys.argv[2], fresh(os.path.join(sys.argv[3], "ckpt-dir"))
common = ["--data.path", data, "--train.max_steps", "20", "--checkpoint.every_steps", "10",
          "--progress", "off"]


def train(args, umask=None, base=common):
    def pre():
        if umask is not None:
            os.umask(umask)
    return subprocess.run([strata, "train"] + base + args, capture_output=True, text=True,
                          preexec_fn=pre, timeout=300)


def expect_error(name, args, *needles):
    r = train(args)
    errs = [l for l in r.stderr.splitlines() if l.startswith("strata: error:")]
    if r.returncode != 2 or len(errs) != 1 or not all(n in errs[0] for n in needles):
        fail(f"{name}: expected exit 2 and one error line with {needles}, got {r.returncode}:\n{r.stderr}")
    if "training" in r.stdout and "steps" in r.stdout:
        fail(f"{name}: training started before the directory was checked:\n{r.stdout}")
    print(f"{name}: {errs[0]}")


# 1. A file where the directory should be.
f = os.path.join(work, "a-file")
open(f, "w").close()
expect_error("not a directory", ["--output.dir", os.path.join(work, "o1"), "--checkpoint.dir", f],
             f"checkpoint.dir {f}: exists and is not a directory")

# 2. Files follow the umask but are never world-writable, even with umask 000: checkpoints,
# the node-local cache, the goodput ledger, the Prometheus file.
out = os.path.join(work, "umask000")
r = train(["--output.dir", out, "--checkpoint.local_dir", os.path.join(out, "local"),
           "--prometheus", os.path.join(out, "prom", "strata.prom")], umask=0)
if r.returncode != 0:
    fail(f"umask 000 run failed:\n{r.stderr}")
checked = 0
for root, dirs, files in os.walk(out):
    for n in dirs + files:
        p = os.path.join(root, n)
        mode = os.stat(p).st_mode
        checked += 1
        if mode & stat.S_IWOTH:
            fail(f"{p} is world-writable ({oct(mode & 0o777)})")
        if not mode & stat.S_IROTH:
            fail(f"{p} is not world-readable under umask 000 ({oct(mode & 0o777)})")
print(f"umask 000: {checked} files and directories, none world-writable")

# Retention: keep_last 2 newest, and every 3rd checkpoint (by sequence number) for good.
out = os.path.join(work, "retention")
r = train(["--output.dir", out, "--train.max_steps", "400", "--checkpoint.every_steps", "50",
           "--checkpoint.keep_last", "2", "--checkpoint.keep_every", "3"],
          base=["--data.path", data, "--progress", "off"])
if r.returncode != 0:
    fail(f"retention run failed:\n{r.stderr}")
left = sorted(n for n in os.listdir(os.path.join(out, "checkpoints")) if n.startswith("ckpt-"))
want = [f"ckpt-{s:09d}.h5" for s in (150, 300, 350, 400)]
if left != want:
    fail(f"retention: expected {want}, found {left}")
print(f"retention (keep_last 2, keep_every 3 of 8 checkpoints): {left}")

# 3 and 4 need small file systems of their own.
skipped = False
for name, opts, needle in (("read-only", "ro,size=4m", "not writable"),
                           ("no space", "size=1m", "MB free, a checkpoint needs 1.9 MB")):
    mnt = os.path.join(work, name.replace(" ", "-"))
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", mnt], capture_output=True).returncode:
        print(f"{name}: SKIPPED (cannot mount a tmpfs here)")
        skipped = True
        continue
    try:
        # The default MLP's checkpoint (parameters + momentum) is 1.9 MB.
        expect_error(name, ["--output.dir", os.path.join(work, "o-" + name[:2]), "--checkpoint.dir", mnt],
                     f"checkpoint.dir {mnt}: ", needle)
    finally:
        subprocess.run(["umount", mnt])


def fills_up_mid_run():
    """Room for one checkpoint at the start, none later: the run trains to the end and writes
    model.h5, but exits 6 (not plain success) with one error line naming the directory; the one
    checkpoint that was written stays intact and named by `latest`, and no temporary is left."""
    mnt = os.path.join(work, "fills-up")
    os.makedirs(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", mnt], capture_output=True).returncode:
        print("fills up mid-run: SKIPPED (cannot mount a tmpfs here)")
        return False
    try:
        out = os.path.join(work, "o-fills-up")
        r = train(["--output.dir", out, "--checkpoint.dir", mnt, "--train.max_steps", "40",
                   "--checkpoint.keep_last", "1"])
        errs = [l for l in r.stderr.splitlines() if l.startswith("strata: error:")]
        warns = [l for l in r.stderr.splitlines() if "writing failed" in l]
        if r.returncode != 6 or len(errs) != 1 or f"checkpoint.dir {mnt}: 3 checkpoint writes failed" not in errs[0]:
            fail(f"fills up mid-run: expected exit 6 and one error line naming {mnt}, got {r.returncode}:\n{r.stderr}")
        if len(warns) != 3:
            fail(f"fills up mid-run: expected a warning for each of the 3 failed writes:\n{r.stderr}")
        if not os.path.exists(os.path.join(out, "model.h5")):
            fail("fills up mid-run: model.h5 was not written")
        # The goodput ledger (a few hundred bytes) may or may not have found room.
        left = sorted(n for n in os.listdir(mnt) if n != "goodput.toml")
        if left != ["ckpt-000000010.h5", "latest"]:
            fail(f"fills up mid-run: expected the step-10 checkpoint and latest, found {left}")
        with open(os.path.join(mnt, "latest")) as f:
            if f.read().strip() != "ckpt-000000010.h5":
                fail("fills up mid-run: latest does not name the step-10 checkpoint")
        i = subprocess.run([strata, "inspect", os.path.join(mnt, "ckpt-000000010.h5")], capture_output=True, text=True)
        if i.returncode != 0:
            fail(f"fills up mid-run: the step-10 checkpoint does not verify:\n{i.stdout}{i.stderr}")
        print(f"fills up mid-run: exit 6, {errs[0]}")
        return True
    finally:
        subprocess.run(["umount", mnt])


if not fills_up_mid_run():
    skipped = True
if skipped:
    sys.exit(77)
print("PASS")
