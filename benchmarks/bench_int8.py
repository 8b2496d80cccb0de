#!/usr/bin/python3
"""int8 inference on one CPU thread: strata's int8 file against strata fp32 and against
PyTorch's quantize_dynamic of the same weights, accuracy and speed in the same run (issue 19).

    benchmarks/bench_int8.py [--strata build/strata] [--mnist data/fashion-mnist.h5]
        [--text FILE.h5] [--models mlp,cnn,gpt] [--repeats 3] [--work DIR]

Models: the shipped configs, trained here on one rank unless --MODEL-params gives a model.h5:
configs/fmnist_mlp.toml, configs/fmnist_cnn.toml (Fashion-MNIST) and configs/gpt_fortunes.toml
(on --text; default: Debian's fortunes `art`, prepared by strata). Then, per model:
  accuracy  strata eval of model.h5 (fp32) and of `strata quantize`'s int8 file; PyTorch
            (Debian's 1.13, engine onednn) on the same weights read from model.h5, fp32 and
            torch.ao.quantization.quantize_dynamic({nn.Linear}, qint8) with each of its CPU
            engines here (onednn, qnnpack; Debian's build has no fbgemm): test accuracy and loss
            (the GPT: validation loss per token) of all four.
  speed     batch 1 and 64 (samples; the GPT: sequences of its context): strata eval
            --throughput (fp32 and int8) and the same loop in PyTorch (no_grad, one thread),
            each batch timed, the first left out; samples/s and p50 / p99 latency per batch.
            Arms alternate within each repeat; medians over repeats.
Reported: the ratios strata int8 / strata fp32 and strata int8 / PyTorch int8, each engine
(the issue's target: >= 1.5 at batch 64), and the accuracy changes (targets: <= 0.5 points, GPT <= 2 %).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def die(msg):
    print(f"bench_int8.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        die(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-800:]}")
    return p.stdout


# --- PyTorch side (a child process: bench_int8.py --torch-worker ...) --------------------------

def torch_worker(a):
    sys.path.insert(0, HERE)
    import torch_baseline as tb  # OpenBLAS's fast kernels, before torch is imported
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    torch.set_num_threads(1)
    tb.report_backends()
    with h5py.File(a.params, "r") as f:
        spec = f.attrs["model_layers"]
        spec = (spec.decode() if isinstance(spec, bytes) else spec).strip().split("\n")
        shape = [int(d) for d in f.attrs["input_shape"]]
        classes = int(f.attrs["classes"])
        stored = {}
        f["params"].visititems(lambda n, o: stored.__setitem__(n.replace("/", "."), o[()])
                               if isinstance(o, h5py.Dataset) else None)
    if spec[0].startswith("embedding"):
        from torch_gpt_model import gpt
        blocks = [s for s in spec if s.startswith("block")]
        dim, heads = int(spec[0].split()[1]), int(blocks[0].split()[1])
        model = gpt(classes, dim, heads, shape[0], len(blocks))
        named = model.strata_params()
    else:
        from torch_reference import build
        model, named = build(spec, tuple(shape))
    with torch.no_grad():
        for n, p in named.items():
            p.copy_(torch.from_numpy(stored[n]))
    model.eval()
    with h5py.File(a.data, "r") as f:
        if spec[0].startswith("embedding"):  # the validation windows strata evaluates
            toks = torch.from_numpy(f["val/tokens"][...].astype(np.int64))
            T = shape[0]
            n = (toks.numel() - 1) // T
            x = torch.stack([toks[i * T:i * T + T] for i in range(n)])
            y = torch.stack([toks[i * T + 1:i * T + T + 1] for i in range(n)])
        else:
            x = torch.from_numpy(f["test/images"][...].astype(np.float32) / 255.0)
            x = x.reshape(-1, *shape)
            y = torch.from_numpy(f["test/labels"][...].astype(np.int64))
    out = {}
    for prec in ("fp32", "int8 onednn", "int8 qnnpack"):
        if prec != "fp32":
            torch.backends.quantized.engine = prec.split()[1]
        m = model if prec == "fp32" else torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear}, dtype=torch.qint8)
        with torch.no_grad():
            loss, correct, rows = 0.0, 0, 0
            step = max(1, 1000 // (x.shape[1] if x.dim() == 2 else 1))  # 1000 rows, as strata
            for i in range(0, len(x), step):
                j = i + step
                logits = m(x[i:j]).reshape(-1, classes)
                t = y[i:j].reshape(-1)
                loss += float(F.cross_entropy(logits, t, reduction="sum"))
                correct += int((logits.argmax(1) == t).sum())
                rows += t.numel()
            out[prec] = {"accuracy": correct / rows, "loss": loss / rows}
            for bs in a.batches:
                lat = []
                for i in range(0, len(x) - bs + 1, bs):
                    t0 = time.perf_counter()
                    m(x[i:i + bs])
                    lat.append(time.perf_counter() - t0)
                lat = lat[1:]
                out[prec][f"b{bs}"] = {"samples_per_s": bs * len(lat) / sum(lat),
                                       "p50_ms": 1e3 * statistics.median(lat),
                                       "p99_ms": 1e3 * sorted(lat)[max(0, math.ceil(0.99 * len(lat)) - 1)]}
    out["torch"] = torch.__version__
    print(json.dumps(out))
    return 0


# --- Driver ------------------------------------------------------------------------------------

def train(a, model):
    path = getattr(a, f"{model}_params")
    if path:
        return path
    out = os.path.join(a.work, f"train-{model}")
    config = {"mlp": "fmnist_mlp", "cnn": "fmnist_cnn", "gpt": "gpt_fortunes"}[model]
    run([a.strata, "train", "--config", os.path.join(ROOT, "configs", config + ".toml"),
         "--data.path", a.text if model == "gpt" else a.mnist, "--threads", "1", "--device", "cpu",
         "--output.dir", out, "--checkpoint.dir", out + "/checkpoints", "--quiet"])
    return os.path.join(out, "model.h5")


def strata_eval(a, params, data, bs, throughput=True):
    cmd = [a.strata, "eval", "--checkpoint", params, "--data", data, "--json", "--threads", "1",
           "--device", "cpu"]
    if throughput:
        cmd += ["--throughput", "--batch_size", str(bs)]
    return json.loads(run(cmd).strip().splitlines()[-1])


def bench(a, model):
    data = a.text if model == "gpt" else a.mnist
    params = train(a, model)
    int8 = os.path.join(a.work, f"{model}-int8.h5")
    print(run([a.strata, "quantize", "--checkpoint", params, "--out", int8]).strip(), flush=True)
    acc = {"strata fp32": strata_eval(a, params, data, 0, False),
           "strata int8": strata_eval(a, int8, data, 0, False)}
    speed = {}
    for r in range(a.repeats):
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        arms = ["strata", "torch"] if r % 2 == 0 else ["torch", "strata"]
        for arm in arms:
            if arm == "torch":
                t = json.loads(run([a.python, os.path.abspath(__file__), "--torch-worker",
                                    "--params", params, "--data", data, "--batches",
                                    *map(str, a.batches)], env=env).strip().splitlines()[-1])
                for prec in ("fp32", "int8 onednn", "int8 qnnpack"):
                    acc[f"PyTorch {prec}"] = t[prec]
                    for bs in a.batches:
                        speed.setdefault((f"PyTorch {prec}", bs), []).append(t[prec][f"b{bs}"])
            else:
                for prec, f in (("fp32", params), ("int8", int8)):
                    for bs in a.batches:
                        e = strata_eval(a, f, data, bs)
                        speed.setdefault((f"strata {prec}", bs), []).append(
                            {"samples_per_s": e["samples_per_s"], "p50_ms": e["latency_p50_ms"],
                             "p99_ms": e["latency_p99_ms"]})
    metric = "validation loss" if model == "gpt" else "test accuracy"
    print(f"{model}: {metric} (loss)")
    for k, v in acc.items():
        print(f"  {k:<20} accuracy {v['accuracy']:.4f}  loss {v['loss']:.4f}")
    for who, q, f in (("strata", "strata int8", "strata fp32"),
                      ("PyTorch onednn", "PyTorch int8 onednn", "PyTorch fp32"),
                      ("PyTorch qnnpack", "PyTorch int8 qnnpack", "PyTorch fp32")):
        if model == "gpt":
            print(f"  int8 validation-loss increase, {who}: "
                  f"{100 * (acc[q]['loss'] / acc[f]['loss'] - 1):+.2f} % (target <= 2 %)")
        else:
            print(f"  int8 accuracy change, {who}: "
                  f"{100 * (acc[q]['accuracy'] - acc[f]['accuracy']):+.2f} points (target >= -0.5)")
    unit = "sequences/s" if model == "gpt" else "samples/s"
    for bs in a.batches:
        med = {k: {m: statistics.median(x[m] for x in v) for m in ("samples_per_s", "p50_ms", "p99_ms")}
               for (k, b), v in speed.items() if b == bs}
        print(f"{model} batch {bs}, median of {a.repeats}: " + "; ".join(
            f"{k} {v['samples_per_s']:.0f} {unit} (p50 {v['p50_ms']:.3f} ms, p99 {v['p99_ms']:.3f} ms)"
            for k, v in med.items()))
        ratios = {}
        for x, y in (("strata int8", "strata fp32"), ("strata int8", "PyTorch int8 onednn"),
                     ("strata int8", "PyTorch int8 qnnpack"), ("strata fp32", "PyTorch fp32")):
            ratios[f"{x} / {y}"] = statistics.median(
                p["samples_per_s"] / q["samples_per_s"] for p, q in zip(speed[x, bs], speed[y, bs]))
        print(f"{model} batch {bs} ratios: " + "; ".join(f"{k} {v:.2f}" for k, v in ratios.items()),
              flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--mnist", default=os.path.join(ROOT, "data", "fashion-mnist.h5"))
    ap.add_argument("--text", default="")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--work", default="/tmp/strata-bench-int8")
    for m in ("mlp", "cnn", "gpt"):
        ap.add_argument(f"--{m}-params", default="", help=f"a trained {m} model.h5 (else trained here)")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    os.makedirs(a.work, exist_ok=True)
    if not a.text:
        a.text = os.path.join(a.work, "art.h5")
        if not os.path.exists(a.text):
            run([a.strata, "prepare", "text", "--input", "/usr/share/games/fortunes/art", "--out", a.text])
    with open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; strata {a.strata}", flush=True)
    for model in a.models.split(","):
        bench(a, model)
    return 0


if __name__ == "__main__":
    import time  # noqa: E402  (the worker's timer)
    sys.exit(main())
