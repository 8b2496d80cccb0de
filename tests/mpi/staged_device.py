#!/usr/bin/python3
"""The GPU path's logic, checked where there is no GPU: --device cpu-staged runs the CPU ops on
memory that strata must treat as a device's (parameters, optimizer state, activations and
batches live apart from their host copies, and move only by upload/download). Every result
must be bitwise the same as --device cpu: the final parameters, a checkpoint written mid-run
(taken from the host copies: a missing download would leave them stale), a resume (a missing
upload would train on stale values), a 2-stage pipeline and 2 data-parallel ranks (also with
ZeRO-2), and eval.
The same for a GPT (a CNN first, then a 2-block GPT on a small byte-level text): its token ids
reach the embedding from device memory (downloaded, checked, uploaded as int32), and every
transformer op reads and writes the staged memory; with 2 stages x 2 replicas and ZeRO-2, gpipe
and zb-h1, ranks sharing one device, the device communicator on one rank, bf16, generate; tensor
parts and int8 files refused as on a GPU. cpu-staged memory faults when host code touches it
(staged_device.h), so a missing download or an MPI call on device memory crashes here, naming
the caller; and no staged run may allocate or free device memory after its second step.

Usage: staged_device.py STRATA DATA.h5 WORKDIR
"""
import os
import shutil
import subprocess
import sys

from common import MPI_ENV, metrics, parameters, run_strata

strata, data, work = sys.argv[1:4]
root = os.path.join(work, "staged-device")
shutil.rmtree(root, ignore_errors=True)
CNN = ["--data.path", data, "--model.type", "cnn", "--model.channels", "4", "8",
       "--model.hidden", "16", "--model.dropout", "0.1", "--train.optimizer", "adamw",
       "--train.lr", "0.01", "--train.grad_clip", "1.0", "--train.batch_size", "32",
       "--checkpoint.every_steps", "10", "--quiet"]
ok = True


def same(a, b):
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def check(what, a, b):
    global ok
    s = same(a, b)
    print(f"{what}: bitwise equal: {s}")
    ok &= s


def train(name, ranks, args, env=None):
    """Trains; on cpu-staged, checks that steps after the second made no device allocation
    or free (the done event's steady_device_allocs / _frees, every rank)."""
    d = os.path.join(root, name)
    if env:
        cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none", strata,
               "train"] + args + ["--output.dir", d]
        p = subprocess.run(cmd, env=dict(MPI_ENV, **env), capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stderr[-4000:]}")
    else:
        run_strata(strata, ranks, ["train"] + args + ["--output.dir", d])
    if "cpu-staged" in args:
        global ok
        done_ev = [m for m in metrics(os.path.join(d, "metrics.jsonl")) if m.get("event") == "done"][-1]
        allocs, frees = done_ev["steady_device_allocs"], done_ev["steady_device_frees"]
        if any(allocs) or any(frees):
            print(f"{name}: FAIL: device allocations after step 2 per rank {allocs}, frees {frees}")
            ok = False
    return d


def ckpt_params(d, step):
    return parameters(os.path.join(d, "checkpoints", f"ckpt-{step:09d}.h5"))


# One rank: dropout, clipping, AdamW, periodic checkpoints.
cpu = train("cnn-cpu", 1, CNN + ["--train.max_steps", "30", "--device", "cpu"])
stg = train("cnn-staged", 1, CNN + ["--train.max_steps", "30", "--device", "cpu-staged"])
check("1 rank CNN, final parameters", parameters(f"{cpu}/model.h5"), parameters(f"{stg}/model.h5"))
check("1 rank CNN, checkpoint at step 20", ckpt_params(cpu, 20), ckpt_params(stg, 20))

# Resume on the staged device: 20 steps, then on to 30 from the checkpoint.
part = train("cnn-staged-resumed", 1, CNN + ["--train.max_steps", "20", "--device", "cpu-staged"])
run_strata(strata, 1, ["train"] + CNN + ["--train.max_steps", "30", "--device", "cpu-staged",
                             "--output.dir", part, "--resume", "auto"])
check("1 rank CNN, 20 steps + resume to 30 vs 30 straight", parameters(f"{stg}/model.h5"),
      parameters(f"{part}/model.h5"))

# A 2-stage pipeline (activations and their gradients cross between the stages' memories).
PIPE = ["--config", os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                                 "fmnist_deep_mlp_pipeline.toml"),
        "--data.path", data, "--train.max_steps", "20", "--quiet",
        "--parallel.pipeline_stages", "2", "--parallel.microbatches", "4",
        "--checkpoint.every_steps", "10"]
a = train("pipe-cpu", 2, PIPE + ["--device", "cpu"])
b = train("pipe-staged", 2, PIPE + ["--device", "cpu-staged"])
check("2-stage pipeline, final parameters", parameters(f"{a}/model.h5"), parameters(f"{b}/model.h5"))
check("2-stage pipeline, checkpoint at step 10", ckpt_params(a, 10), ckpt_params(b, 10))

# Two data-parallel ranks (the gradient allreduce reads the staged memory).
DP = ["--data.path", data, "--train.max_steps", "20", "--quiet", "--train.batch_size", "64"]
a = train("dp-cpu", 2, DP + ["--device", "cpu"])
b = train("dp-staged", 2, DP + ["--device", "cpu-staged"])
check("2 data-parallel ranks, final parameters", parameters(f"{a}/model.h5"), parameters(f"{b}/model.h5"))
# ZeRO-2 on the staged memory: reduce-scatter and all-gather read and write it, the optimizer
# state of a shard is gathered from it for a checkpoint.
ZERO = DP + ["--train.optimizer", "adamw", "--parallel.zero", "2", "--checkpoint.every_steps", "10"]
a = train("zero2-cpu", 2, ZERO + ["--device", "cpu"])
b = train("zero2-staged", 2, ZERO + ["--device", "cpu-staged"])
check("2 data-parallel ranks, ZeRO-2, final parameters", parameters(f"{a}/model.h5"), parameters(f"{b}/model.h5"))
check("2 data-parallel ranks, ZeRO-2, checkpoint at step 10", ckpt_params(a, 10), ckpt_params(b, 10))

# eval reads the parameter file into the staged memory.
outs = []
for dev in ("cpu", "cpu-staged"):
    p = subprocess.run([strata, "eval", "--checkpoint", f"{cpu}/model.h5", "--data", data,
                        "--json", "--device", dev], env=MPI_ENV, capture_output=True, text=True,
                       check=True)
    outs.append(p.stdout.strip())
print(f"eval: cpu {outs[0]}, cpu-staged {outs[1]}")
ok &= outs[0] == outs[1]

# GPT: the tiny text of tests/mpi/gpt_grid_equivalence.py (Debian's fortunes, art).
text = os.path.join(root, "art.h5")
subprocess.run([strata, "prepare", "text", "--input", "/usr/share/games/fortunes/art",
                "--out", text], env=MPI_ENV, check=True, capture_output=True)
GPT = ["--data.path", text, "--model.type", "gpt", "--model.layers", "2", "--model.heads", "4",
       "--model.dim", "32", "--model.context", "16", "--model.dropout", "0.1",
       "--train.optimizer", "adamw", "--train.lr", "0.003", "--train.grad_clip", "0.5",
       "--train.batch_size", "8", "--train.seed", "5", "--checkpoint.every_steps", "10",
       "--quiet"]
cpu = train("gpt-cpu", 1, GPT + ["--train.max_steps", "20", "--device", "cpu"])
stg = train("gpt-staged", 1, GPT + ["--train.max_steps", "20", "--device", "cpu-staged"])
check("1 rank GPT, final parameters", parameters(f"{cpu}/model.h5"), parameters(f"{stg}/model.h5"))
check("1 rank GPT, checkpoint at step 10", ckpt_params(cpu, 10), ckpt_params(stg, 10))
part = train("gpt-staged-resumed", 1, GPT + ["--train.max_steps", "10", "--device", "cpu-staged"])
run_strata(strata, 1, ["train"] + GPT + ["--train.max_steps", "20", "--device", "cpu-staged",
                             "--output.dir", part, "--resume", "auto"])
check("1 rank GPT, 10 steps + resume to 20 vs 20 straight", parameters(f"{stg}/model.h5"),
      parameters(f"{part}/model.h5"))
# Recomputed blocks (their activations rebuilt in staged memory during backward).
a = train("gpt-recompute-cpu", 1, GPT + ["--train.max_steps", "10", "--train.recompute", "block",
                                         "--device", "cpu"])
b = train("gpt-recompute-staged", 1, GPT + ["--train.max_steps", "10", "--train.recompute",
                                            "block", "--device", "cpu-staged"])
check("1 rank GPT with recompute, final parameters", parameters(f"{a}/model.h5"),
      parameters(f"{b}/model.h5"))
# Two pipeline stages (the embedding on one, the tied head on the other) and 2 data-parallel
# ranks.
PIPE = ["--parallel.pipeline_stages", "2", "--parallel.microbatches", "2", "--train.max_steps", "10"]
a = train("gpt-pipe-cpu", 2, GPT + PIPE + ["--device", "cpu"])
b = train("gpt-pipe-staged", 2, GPT + PIPE + ["--device", "cpu-staged"])
check("GPT, 2-stage pipeline, final parameters", parameters(f"{a}/model.h5"),
      parameters(f"{b}/model.h5"))
a = train("gpt-dp-cpu", 2, GPT + ["--train.max_steps", "10", "--device", "cpu"])
b = train("gpt-dp-staged", 2, GPT + ["--train.max_steps", "10", "--device", "cpu-staged"])
check("GPT, 2 data-parallel ranks, final parameters", parameters(f"{a}/model.h5"),
      parameters(f"{b}/model.h5"))
outs = []
for dev in ("cpu", "cpu-staged"):
    p = subprocess.run([strata, "eval", "--checkpoint", f"{cpu}/model.h5", "--data", text,
                        "--json", "--device", dev], env=MPI_ENV, capture_output=True, text=True,
                       check=True)
    outs.append(p.stdout.strip())
print(f"GPT eval: cpu {outs[0]}, cpu-staged {outs[1]}")
ok &= outs[0] == outs[1]

# ZeRO-2 with the tied table on 2 stages x 2 replicas, and the other schedules.
ZERO_PIPE = ["--parallel.pipeline_stages", "2", "--parallel.microbatches", "2",
             "--parallel.zero", "2", "--train.max_steps", "8"]
a = train("gpt-zero2-pipe-cpu", 4, GPT + ZERO_PIPE + ["--device", "cpu"])
b = train("gpt-zero2-pipe-staged", 4, GPT + ZERO_PIPE + ["--device", "cpu-staged"])
check("GPT, 2 stages x 2 replicas, ZeRO-2, final parameters", parameters(f"{a}/model.h5"),
      parameters(f"{b}/model.h5"))
for sched in ("gpipe", "zb-h1"):
    S = ["--parallel.pipeline_stages", "2", "--parallel.microbatches", "2",
         "--parallel.schedule", sched, "--train.max_steps", "6"]
    a = train(f"gpt-{sched}-cpu", 2, GPT + S + ["--device", "cpu"])
    b = train(f"gpt-{sched}-staged", 2, GPT + S + ["--device", "cpu-staged"])
    check(f"GPT, 2 stages, {sched}, final parameters", parameters(f"{a}/model.h5"),
          parameters(f"{b}/model.h5"))

# The device communicator's other paths: ranks that share a device (sums staged through the
# host, as on a GPU node with more ranks than GPUs), and its collectives on one rank.
DP2 = GPT + ["--train.max_steps", "6", "--parallel.zero", "2"]
a = train("gpt-zero2-cpu", 2, DP2 + ["--device", "cpu"])
b = train("gpt-zero2-shared", 2, DP2 + ["--device", "cpu-staged"],
          env={"STRATA_STAGED_SHARED_DEVICE": "1"})
check("GPT ZeRO-2, 2 ranks sharing one device, final parameters", parameters(f"{a}/model.h5"),
      parameters(f"{b}/model.h5"))
ONE = GPT + ["--train.max_steps", "6"]
a = train("gpt-one-cpu", 1, ONE + ["--device", "cpu"])
for zero in ("0", "2"):
    b = train(f"gpt-one-comm-zero{zero}", 1, ONE + ["--device", "cpu-staged", "--parallel.zero", zero],
              env={"STRATA_DEVICE_COMM_ONE_RANK": "1"})
    check(f"GPT, 1 rank, zero {zero}, the device communicator's collectives alone, final parameters",
          parameters(f"{a}/model.h5"), parameters(f"{b}/model.h5"))

# bf16 (where this CPU has native bf16 GEMMs).
if "avx512_bf16" in open("/proc/cpuinfo").read() or "amx_bf16" in open("/proc/cpuinfo").read():
    B16 = GPT + ["--train.max_steps", "6", "--train.precision", "bf16"]
    a = train("gpt-bf16-cpu", 1, B16 + ["--device", "cpu"])
    b = train("gpt-bf16-staged", 1, B16 + ["--device", "cpu-staged"])
    check("GPT bf16, final parameters", parameters(f"{a}/model.h5"), parameters(f"{b}/model.h5"))
else:
    print("GPT bf16: skipped: this CPU has no native bf16 GEMMs")

# generate on the staged device: the same text as on the CPU.
outs = []
for dev in ("cpu", "cpu-staged"):
    p = subprocess.run([strata, "generate", "--checkpoint", f"{cpu}/model.h5", "--prompt", "The ",
                        "--tokens", "20", "--seed", "3", "--device", dev], env=MPI_ENV,
                       capture_output=True, check=True)
    outs.append(p.stdout)  # bytes: a byte-level model's text need not be UTF-8
print(f"generate: cpu {outs[0]!r}, cpu-staged {outs[1]!r}")
ok &= outs[0] == outs[1]

# Refused on a device, as on a GPU: tensor parts, and int8 files (the CPU-only ops).
p = subprocess.run(["mpirun", "-n", "2", "--oversubscribe", strata, "train"] + GPT +
                   ["--parallel.tensor", "2", "--device", "cpu-staged", "--output.dir",
                    os.path.join(root, "tp")], env=MPI_ENV, capture_output=True, text=True)
print(f"tensor parts on cpu-staged: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
ok &= p.returncode == 2 and "parallel.tensor" in p.stderr
cnn = os.path.join(root, "cnn-cpu", "model.h5")
q = os.path.join(root, "cnn-int8.h5")
subprocess.run([strata, "quantize", "--checkpoint", cnn, "--out", q], env=MPI_ENV, check=True,
               capture_output=True)
p = subprocess.run([strata, "eval", "--checkpoint", q, "--data", data, "--device", "cpu-staged"],
                   env=MPI_ENV, capture_output=True, text=True)
print(f"int8 eval on cpu-staged: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
ok &= p.returncode == 2 and "int8" in p.stderr
sys.exit(0 if ok else 1)
