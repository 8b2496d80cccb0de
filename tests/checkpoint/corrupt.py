"""A damaged latest checkpoint (one flipped byte, truncated) is reported by name and skipped for
the one before it; the resumed run still ends bitwise identical to the uninterrupted one; the
damaged files are kept (renamed *.corrupt), and when no checkpoint verifies strata refuses to
start over (exit 4) without deleting anything. Usage: corrupt.py STRATA DATA WORKDIR"""
import glob
import os
import shutil
import subprocess
import sys

from ckpt_common import assert_bitwise, fail, fresh, run

strata, data, work = sys.argv[1], sys.argv[2], fresh(os.path.join(sys.argv[3], "corrupt"))
common = ["--data.path", data, "--model.hidden", "64", "--train.max_steps", "400",
          "--train.seed", "3", "--checkpoint.every_steps", "100", "--checkpoint.keep_last", "4",
          "--progress", "off"]
ref = os.path.join(work, "ref")
run(strata, 1, common + ["--output.dir", ref])
ref_ckpts = os.path.join(ref, "checkpoints")
names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ref_ckpts, "ckpt-*.h5")))
if names != [f"ckpt-{s:09d}.h5" for s in (100, 200, 300, 400)]:
    fail(f"unexpected checkpoints {names}")


def flip_byte(path, frac):
    size = os.path.getsize(path)
    at = int(size * frac)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))
    return at


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def inspect(path):
    return subprocess.run([strata, "inspect", path], capture_output=True, text=True)


def case(name, damage, expect_from):
    d = os.path.join(work, name)
    shutil.copytree(ref_ckpts, os.path.join(d, "checkpoints"))
    damaged = damage(os.path.join(d, "checkpoints"))
    for path in damaged:
        r = inspect(path)
        if r.returncode != 4:
            fail(f"{name}: strata inspect {path} exited {r.returncode}, expected 4\n{r.stdout}{r.stderr}")
    out, err = run(strata, 1, common + ["--output.dir", d, "--resume", "auto"])
    for path in damaged:
        if os.path.basename(path) not in err:
            fail(f"{name}: the damaged {path} is not named in stderr:\n{err}")
        if not os.path.exists(path + ".corrupt"):
            fail(f"{name}: {path} was not kept as {path}.corrupt")
    want = f"resumed from {d}/checkpoints/ckpt-{expect_from:09d}.h5 at step {expect_from}"
    if want not in out:
        fail(f"{name}: expected '{want}' in the log:\n{out[-2000:]}")
    assert_bitwise(os.path.join(ref, "model.h5"), os.path.join(d, "model.h5"), name)
    r = inspect(os.path.join(d, "checkpoints", "ckpt-000000400.h5"))
    if r.returncode != 0 or "all checksums verify" not in r.stdout:
        fail(f"{name}: the rewritten final checkpoint does not verify:\n{r.stdout}{r.stderr}")


def flip_latest(c):
    p = os.path.join(c, "ckpt-000000400.h5")
    flip_byte(p, 0.6)
    return [p]


def truncate_latest_flip_previous(c):
    a, b = os.path.join(c, "ckpt-000000400.h5"), os.path.join(c, "ckpt-000000300.h5")
    truncate(a)
    flip_byte(b, 0.3)
    return [a, b]


case("flipped-byte", flip_latest, 300)
case("truncated-and-flipped", truncate_latest_flip_previous, 200)

# Nothing verifies: exit 4, a message naming the directory, and every file still there.
d = os.path.join(work, "all-bad")
shutil.copytree(ref_ckpts, os.path.join(d, "checkpoints"))
for i, p in enumerate(sorted(glob.glob(os.path.join(d, "checkpoints", "ckpt-*.h5")))):
    truncate(p) if i % 2 else flip_byte(p, 0.5)
out, err = run(strata, 1, common + ["--output.dir", d, "--resume", "auto"], expect=4)
if "none of the 4 checkpoints verifies" not in err:
    fail(f"all-bad: expected a message that none verifies:\n{err}")
left = sorted(os.listdir(os.path.join(d, "checkpoints")))
if len([n for n in left if n.endswith(".corrupt")]) != 4 or os.path.exists(os.path.join(d, "model.h5")):
    fail(f"all-bad: files lost or a model written: {left}")
print("all-bad: exit 4, nothing deleted")

# A checkpoint of another model is refused (exit 4) rather than loaded or skipped.
d = os.path.join(work, "other-model")
shutil.copytree(ref_ckpts, os.path.join(d, "checkpoints"))
out, err = run(strata, 1, common + ["--output.dir", d, "--resume", "auto", "--model.hidden", "32"], expect=4)
if "different model" not in err:
    fail(f"other-model: expected 'different model' in:\n{err}")
print("other-model: exit 4 naming the mismatch")
print("PASS")
