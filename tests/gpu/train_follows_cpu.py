"""Training on the GPU follows the CPU (the fp32 reference), and resumes there bit for bit.

train_follows_cpu.py STRATA DATA WORKDIR CONFIGS_DIR CASE
  CASE mlp | cnn | mlp-bf16 | cnn-bf16: 30 steps on --device cpu and on --device cuda from the
       same initial parameters and batches; every step's loss must agree within the stated
       relative tolerance (fp32: different summation orders only; bf16: 8-bit mantissas in the
       GEMMs and convolutions).
  CASE resume: 20 steps on the GPU straight, and 10 + a resume for 10 more: the resumed
       losses must equal the straight run's exactly.
  CASE pipeline: 2 ranks (2 stages, 4 micro-batches) on the GPU beside 1 CPU rank.
  CASE gpt | gpt-bf16: a 2-block GPT (dim 64, 4 heads, context 64, dropout 0.1, AdamW with
       gradient clipping) on the bytes of the repository's README.md (prepared with `strata
       prepare text`: the GPU machines have no fortunes package), 30 steps on the CPU and on
       the GPU, every step's loss within the same tolerances.
  CASE gpt-resume: the GPT, 20 steps straight on the GPU against 10 + a resume for 10: equal
       losses exactly (the transformer's kernels are deterministic: no float atomics).
Exits 77 (ctest: skipped) when no GPU is visible. Needs only the Python standard library
(the GPU machines have no h5py).
"""
import json
import os
import shutil
import subprocess
import sys

STRATA, DATA, WORK, CONFIGS, CASE = sys.argv[1:6]
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
# Relative tolerance on each step's loss, GPU against CPU.
TOL = {"fp32": 1e-4, "bf16": 3e-2}


def run(args, ranks=1, check=True):
    cmd = [STRATA, "train"] + args
    if ranks > 1:
        cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    if check and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


def losses(outdir):
    with open(os.path.join(outdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {r["step"]: r["loss"] for r in rows if "event" not in r}


def common(config, outdir, steps, device, precision="fp32"):
    return ["--config", os.path.join(CONFIGS, config), "--data.path", DATA, "--quiet",
            "--train.max_steps", str(steps), "--train.log_every", "1", "--device", device,
            "--train.precision", precision, "--output.dir", outdir]


GPT = ["--model.type", "gpt", "--model.layers", "2", "--model.heads", "4", "--model.dim", "64",
       "--model.context", "64", "--model.dropout", "0.1", "--train.optimizer", "adamw",
       "--train.lr", "0.003", "--train.grad_clip", "1.0", "--train.batch_size", "8",
       "--train.seed", "5"]


def gpt_common(outdir, steps, device, precision="fp32"):
    text = os.path.join(WORK, "gpu", "readme-bytes.h5")
    if not os.path.exists(text):
        readme = os.path.join(CONFIGS, "..", "README.md")
        os.makedirs(os.path.dirname(text), exist_ok=True)
        p = subprocess.run([STRATA, "prepare", "text", "--input", readme, "--out", text],
                           env=ENV, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            sys.exit(f"FAIL: strata prepare text exited {p.returncode}\n{p.stderr[-3000:]}")
    return GPT + ["--data.path", text, "--quiet", "--train.max_steps", str(steps),
                  "--train.log_every", "1", "--device", device, "--train.precision", precision,
                  "--output.dir", outdir]


def fresh(name):
    d = os.path.join(WORK, "gpu", CASE, name)
    shutil.rmtree(d, ignore_errors=True)
    return d


# Skip (77) when this node has no GPU; any other failure to start is a failure.
probe = run(common("fmnist_mlp.toml", fresh("probe"), 1, "cuda"), check=False)
if probe.returncode == 2 and "device cuda:" in probe.stderr:
    print("skipped: " + probe.stderr.strip().splitlines()[-1])
    sys.exit(77)
if probe.returncode != 0:
    sys.exit(f"FAIL: probe run exited {probe.returncode}\n{probe.stderr[-3000:]}")
print(probe.stdout.splitlines()[0])


def compare(ref, got, tol, what):
    worst = 0.0
    for step, a in sorted(ref.items()):
        b = got.get(step)
        if b is None:
            sys.exit(f"FAIL: {what}: no loss at step {step}")
        rel = abs(a - b) / max(abs(a), 1e-12)
        worst = max(worst, rel)
        print(f"  step {step:3d}  cpu {a:.7f}  gpu {b:.7f}  rel {rel:.2e}")
    print(f"{what}: worst relative difference {worst:.2e} (tolerance {tol:.0e})")
    if worst > tol:
        sys.exit(f"FAIL: {what}: {worst:.2e} > {tol:.0e}")


if CASE in ("mlp", "cnn", "mlp-bf16", "cnn-bf16"):
    model, _, prec = CASE.partition("-")
    prec = prec or "fp32"
    cfg = f"fmnist_{model}.toml"
    cpu, gpu = fresh("cpu"), fresh("gpu")
    run(common(cfg, cpu, 30, "cpu"))
    run(common(cfg, gpu, 30, "cuda", prec))
    compare(losses(cpu), losses(gpu), TOL[prec], f"{model} {prec}, GPU against CPU")
elif CASE == "resume":
    straight, parts = fresh("straight"), fresh("parts")
    run(common("fmnist_cnn.toml", straight, 20, "cuda"))
    ck = ["--checkpoint.every_steps", "10"]
    run(common("fmnist_cnn.toml", parts, 10, "cuda") + ck)
    run(common("fmnist_cnn.toml", parts, 20, "cuda") + ck + ["--resume", "auto"])
    a, b = losses(straight), losses(parts)
    diff = [s for s in range(11, 21) if a.get(s) != b.get(s)]
    if diff:
        sys.exit(f"FAIL: resumed GPU run differs from the straight one at steps {diff}")
    print("resume on the GPU: steps 11-20 identical to the straight run")
elif CASE == "pipeline":
    cpu, gpu = fresh("cpu"), fresh("gpu")
    cfg = "fmnist_deep_mlp_pipeline.toml"
    run(common(cfg, cpu, 30, "cpu") + ["--parallel.pipeline_stages", "1", "--parallel.microbatches", "4"])
    run(common(cfg, gpu, 30, "cuda") + ["--parallel.pipeline_stages", "2", "--parallel.microbatches", "4"],
        ranks=2)
    compare(losses(cpu), losses(gpu), TOL["fp32"], "pipeline 2 stages on the GPU against 1 CPU rank")
elif CASE in ("gpt", "gpt-bf16"):
    prec = "bf16" if CASE == "gpt-bf16" else "fp32"
    cpu, gpu = fresh("cpu"), fresh("gpu")
    run(gpt_common(cpu, 30, "cpu"))
    run(gpt_common(gpu, 30, "cuda", prec))
    compare(losses(cpu), losses(gpu), TOL[prec], f"GPT {prec}, GPU against CPU")
elif CASE == "gpt-resume":
    straight, parts = fresh("straight"), fresh("parts")
    run(gpt_common(straight, 20, "cuda"))
    ck = ["--checkpoint.every_steps", "10"]
    run(gpt_common(parts, 10, "cuda") + ck)
    run(gpt_common(parts, 20, "cuda") + ck + ["--resume", "auto"])
    a, b = losses(straight), losses(parts)
    diff = [s for s in range(11, 21) if a.get(s) != b.get(s)]
    if diff:
        sys.exit(f"FAIL: resumed GPT run on the GPU differs from the straight one at steps {diff}")
    print("GPT resume on the GPU: steps 11-20 identical to the straight run")
else:
    sys.exit(f"unknown case {CASE}")
