#!/usr/bin/python3
"""PyTorch baseline for strata's training-speed benchmark (benchmarks/bench_train.sh).

Trains the same network as configs/fmnist_{mlp,cnn}.toml with the same optimizer on the same
HDF5 file strata reads, and prints one JSON line on stdout:
  {"framework": "pytorch", "model": ..., "steps": ..., "train_time_s": ...,
   "samples_per_s": ..., "test_accuracy": ..., ...}

Run it with Debian's interpreter (/usr/bin/python3, which has python3-torch and python3-h5py).
Kernel choice: OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE or its own
CPU detection, which on a VM's generic "Intel Xeon Processor" falls back to the slow Prescott
kernels. This script sets OPENBLAS_CORETYPE before importing torch to the fastest kernels for
the CPU's flags (SkylakeX with AVX-512, Haswell with AVX2), replacing any inherited value;
BENCH_OPENBLAS_CORETYPE overrides the choice. It stops when torch's BLAS is not OpenBLAS
(with Debian's reference libblas3 the GPT ran at 76 instead of 2046 tokens/s). The kernels and
BLAS threads in use are printed to stderr.

Fairness notes (what differs from strata's loop):
  * The whole data set is read and converted to float32/255 in memory ONCE, before timing.
    strata reads and converts each batch from the HDF5 file inside its timed loop (on a
    loader thread), so this gives PyTorch an advantage: no per-batch I/O or conversion.
  * The per-batch gather x[idx] (a copy of the shuffled rows) is inside the timed loop, as
    strata's batch assembly is.
  * Timing covers only the training loop (forward, loss, backward, optimizer step for every
    step); model construction, data loading and the test evaluation are outside it.
"""
import argparse
import ctypes
import json
import os
import sys
import time


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _threads_arg() -> str:
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# Both must be in the environment before torch loads OpenBLAS (at `import torch`):
#  * OPENBLAS_CORETYPE: see above (bench_train.sh sets it too; a value already set is kept).
#  * OPENBLAS_NUM_THREADS: torch.set_num_threads() sets ATen's OpenMP threads but not the
#    thread pool of Debian's openblas-pthread, which otherwise starts one thread per core.
#    "One thread" must mean one thread for the BLAS too (strata limits its OpenBLAS the same way).
def fast_coretype() -> str:
    """The OpenBLAS kernel set PyTorch gets: BENCH_OPENBLAS_CORETYPE if set, else the fastest
    one for this CPU's instruction set. An OPENBLAS_CORETYPE inherited from the environment is
    not trusted: machine images set it for other reasons (one here had Haswell, AVX2 kernels
    at half of SkylakeX's sgemm speed on an AVX-512 core), which would flatter strata."""
    explicit = os.environ.get("BENCH_OPENBLAS_CORETYPE", "")
    if explicit:
        return explicit
    flags = _cpu_flags()
    if "avx512f" in flags:
        return "SkylakeX"
    if "avx2" in flags:
        return "Haswell"
    return ""


INHERITED_CORETYPE = os.environ.get("OPENBLAS_CORETYPE", "")
if _core := fast_coretype():
    os.environ["OPENBLAS_CORETYPE"] = _core
os.environ.setdefault("OPENBLAS_NUM_THREADS", _threads_arg())
os.environ.setdefault("OMP_NUM_THREADS", _threads_arg())

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def build_model(kind: str) -> nn.Module:
    if kind == "mlp":  # 784-256-128-10 ReLU, as configs/fmnist_mlp.toml
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 256), nn.ReLU(),
            nn.Linear(256, 128), nn.ReLU(),
            nn.Linear(128, 10))
    if kind == "cnn":  # conv3x3(32,p1)-ReLU-pool2-conv3x3(64,p1)-ReLU-pool2-fc128-ReLU-fc10
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
            nn.Linear(128, 10))
    raise SystemExit(f"torch_baseline.py: unknown model {kind!r} (mlp | cnn)")


def load_split(path: str, split: str):
    with h5py.File(path, "r") as f:
        images = f[f"{split}/images"][...]
        labels = f[f"{split}/labels"][...]
    # uint8 (N, 28, 28) -> float32 (N, 1, 28, 28) in [0, 1], as strata's loader scales it.
    x = torch.from_numpy(images.astype(np.float32) / np.float32(255.0))
    if x.dim() == 3:
        x = x.unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x.contiguous(), y


def openblas() -> tuple:
    """(kernel name, threads) of the OpenBLAS loaded into this process (('', 0) if none)."""
    try:
        with open("/proc/self/maps") as m:
            libs = {ln.split()[-1] for ln in m if "openblas" in ln.lower() and ".so" in ln}
        for lib in sorted(libs):
            dll = ctypes.CDLL(lib)
            dll.openblas_get_corename.restype = ctypes.c_char_p
            return dll.openblas_get_corename().decode(), int(dll.openblas_get_num_threads())
    except (OSError, AttributeError):
        pass
    return "", 0


def require_openblas(core: str, blas_threads: int, threads: int) -> None:
    """Stops unless torch runs OpenBLAS with `threads` threads: any other BLAS makes a baseline
    that is not PyTorch at its speed on this machine."""
    if not core:
        raise SystemExit("torch_baseline.py: torch's BLAS is not OpenBLAS (Debian's reference "
                         "libblas3 is selected?): apt-get install libopenblas0-pthread")
    if blas_threads != threads:
        raise SystemExit(f"torch_baseline.py: OpenBLAS runs {blas_threads} threads, not "
                         f"{threads}: OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")


def report_backends() -> dict:
    """Prints the parts of torch's build configuration that decide its CPU speed to stderr."""
    keep = ("blas", "lapack", "mkl", "mkldnn", "cpu capability", "openmp")
    cfg = torch.__config__.show().splitlines()
    lines = [ln.strip() for ln in cfg if any(k in ln.lower() for k in keep) and "CXX_FLAGS" not in ln]
    for ln in cfg:  # the interesting keys of the long "Build settings" line
        if "Build settings:" in ln:
            for kv in ln.split("Build settings:", 1)[1].split(", "):
                if kv.split("=")[0].strip() in ("BLAS_INFO", "LAPACK_INFO", "USE_MKLDNN",
                                                "PERF_WITH_AVX512", "USE_OPENMP"):
                    lines.append(kv.strip())
    core, blas_threads = openblas()
    info = {"torch": torch.__version__, "openblas_core": core, "openblas_threads": blas_threads,
            "mkldnn": torch.backends.mkldnn.is_available(),
            "threads": torch.get_num_threads()}
    print("pytorch backends: " + json.dumps(info), file=sys.stderr)
    for ln in lines:
        print("  " + ln.lstrip("- "), file=sys.stderr)
    print("  " + "  ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in (
        "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY"))
        + (f"  (inherited OPENBLAS_CORETYPE={INHERITED_CORETYPE} replaced)"
           if INHERITED_CORETYPE and INHERITED_CORETYPE != os.environ.get("OPENBLAS_CORETYPE")
           else ""), file=sys.stderr)
    return info


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> float:
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], batch):
        correct += int((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    model.train()
    return correct / x.shape[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "cnn"), required=True)
    ap.add_argument("--data", default="data/fashion-mnist.h5")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0 = all epochs)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet-config", action="store_true", help="do not print the backends")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if not a.quiet_config:
        report_backends()
    core, blas_threads = openblas()
    require_openblas(core, blas_threads, a.threads)

    x_train, y_train = load_split(a.data, "train")
    x_test, y_test = load_split(a.data, "test")
    n = x_train.shape[0]
    per_epoch = n // a.batch_size  # drop_last, as strata
    total = per_epoch * a.epochs
    if a.max_steps > 0:
        total = min(total, a.max_steps)

    model = build_model(a.model)
    loss_fn = nn.CrossEntropyLoss()  # mean over the batch, as strata's softmax_xent (1/G)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(a.seed)

    model.train()
    step = 0
    last_loss = float("nan")
    t0 = time.perf_counter()
    while step < total:
        perm = torch.randperm(n, generator=gen)  # shuffled each epoch
        for b in range(per_epoch):
            if step >= total:
                break
            idx = perm[b * a.batch_size:(b + 1) * a.batch_size]
            xb, yb = x_train[idx], y_train[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            step += 1
        last_loss = float(loss)  # the epoch's last loss, for the JSON line
    train_s = time.perf_counter() - t0

    acc = evaluate(model, x_test, y_test)
    print(json.dumps({
        "framework": "pytorch", "model": a.model, "steps": total, "batch_size": a.batch_size,
        "threads": a.threads, "precision": a.precision, "train_time_s": train_s,
        "samples_per_s": total * a.batch_size / train_s, "test_accuracy": acc,
        "final_loss": last_loss, "openblas_core": core, "openblas_threads": blas_threads,
        "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
