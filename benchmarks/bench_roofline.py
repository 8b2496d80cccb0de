#!/usr/bin/python3
"""Whole training steps against the core's peak: strata and PyTorch on one CPU thread, each
step's GFLOP/s and its share of the core's measured peak, in the same run (issue 34).

    benchmarks/bench_roofline.py [--strata build/strata] [--bench-gemm build/benchmarks/bench_gemm]
        [--mnist data/fashion-mnist.h5] [--text data/fortunes-bench.h5] [--repeats 3]
        [--models mlp,cnn,gpt-bf16,gpt-fp32] [--profile] [--profile-only]
    benchmarks/bench_roofline.py --check-flops --strata S --mnist M --text T

Models and arms are bench_bf16.py's (its runners, imported): `mlp` is configs/fmnist_mlp.toml
(batch 64, 3 epochs, samples/s), `cnn` configs/fmnist_cnn.toml (batch 64, 300 steps), `gpt`
bench_gpt.py's GPT (6 blocks, dim 384, 6 heads, context 256, vocab 256, batch 8, AdamW; tokens/s
of 10 steps after 2 of warm-up). A model's name may carry the precision (`gpt-bf16`; `mlp` is
`mlp-fp32`). Each model runs two arms, strata (--threads 1 --train.precision P) and PyTorch
(one thread; bf16: CPU autocast), in an order that alternates between repeats; reported are the
medians of the repeats and the median of the per-repeat ratios.

FLOPs per training step are counted from the architecture, not measured: every GEMM-like
product's multiply-adds x 2. Counted: each Linear's forward, its weight gradient and its input
gradient, except the first layer's (its input is the data: no gradient is computed); each
convolution as its im2col GEMM (OC x C*KH*KW by C*KH*KW x OH*OW per sample), forward, weight
gradient and the columns' gradient (again not for the first layer); the GPT's four Linears per
block, its LM head (forward, input and weight gradients: the weight is the tied token table)
and attention's QK^T and AV products with their four backward products, over the causal
entries only (T(T+1)/2 per head and product: the work the model needs; a kernel that also
computes the masked half gets no credit for it). Not counted: biases, activations, pooling,
LayerNorm, softmax and loss, embeddings, the optimizer, the loader (elementwise work). One
training step is therefore 3 x the forward products (2 x for the first layer).

The peak is `bench_gemm --peak` (12 independent chains of 512-bit FMAs, and of vdpbf16ps for
bf16), measured before each model and after the last; each is printed and their median used.
fp32 arms are measured against the fp32 peak, bf16 arms against the bf16 peak. Per model:
each arm's throughput, GFLOP/s and share of the peak; strata / PyTorch; and the bound, the
ratio strata would reach at 100 % of the peak (peak / PyTorch's GFLOP/s): whether a 2x target
can be met on this CPU at all. The targets of issue 34 are printed beside (MLP and CNN fp32
>= 2x PyTorch, GPT bf16 >= 80 % of the bf16 peak); missing one is not an error.

--profile: then one more run of each strata arm under `perf record` (DNNL_JIT_PROFILE=2, so
oneDNN's JIT kernels have names), its samples' shares by category (see CATEGORIES); without
perf, or without permission to use it, the profile is skipped with a note.
--check-flops: this script's forward FLOPs per sample beside the "MFLOP per sample forward"
strata prints for the same model (two decimals), for the shipped MLP and CNN and wider
variants of them (where one layer more or less shows in the two decimals) and a small GPT
(whose figure strata counts with full T x T attention and 8 FLOPs per element of the final
LayerNorm, added here for the comparison). Exit 1 when one differs.

Exit status 0; 2 when a run fails; 1 when --check-flops finds a difference."""
import argparse
import collections
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tomllib
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_bf16 as bb  # noqa: E402  (the arms: image_arm, gpt_arm, strata_image_cmd)
import bench_gpt as bg  # noqa: E402  (load1, cpu_ticks, steal_percent, strata_cmd)

FMNIST_SHAPE, FMNIST_CLASSES = (1, 28, 28), 10
FRAMEWORKS = ("strata", "torch")
LABEL = {"strata": "strata", "torch": "PyTorch"}
TARGET_RATIO = {"mlp-fp32": 2.0, "cnn-fp32": 2.0}  # issue 34: strata / PyTorch at least
TARGET_SHARE = {"gpt-bf16": 0.80}  # issue 34: strata's share of the bf16 peak at least


def die(msg):
    print(f"bench_roofline.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


# --- FLOPs per sample ---------------------------------------------------------------------------

def image_flops(model, hidden=None, channels=None):
    """(forward, training step) FLOPs per sample of configs/fmnist_MODEL.toml; hidden and
    channels replace the config's (--check-flops' wider variants)."""
    with open(os.path.join(ROOT, "configs", f"fmnist_{model}.toml"), "rb") as f:
        m = tomllib.load(f)["model"]
    hidden = m["hidden"] if hidden is None else hidden
    channels = (m.get("channels", []) if channels is None else channels) if model == "cnn" else []
    fwd = step = 0.0
    first = True  # no input gradient for the first layer: its input is the data
    c, h, w = FMNIST_SHAPE
    for oc in channels:  # conv k x k, stride 1, pad k // 2, then ReLU and 2 x 2 max-pooling
        k = m["kernel"]
        oh, ow = h + 2 * (k // 2) - k + 1, w + 2 * (k // 2) - k + 1
        f = 2.0 * oc * oh * ow * c * k * k
        fwd, step = fwd + f, step + f * (2 if first else 3)
        first, c, h, w = False, oc, oh // 2, ow // 2
    n = c * h * w
    for o in list(hidden) + [FMNIST_CLASSES]:
        f = 2.0 * n * o
        fwd, step = fwd + f, step + f * (2 if first else 3)
        first, n = False, o
    return fwd, step


def gpt_flops(g, vocab, causal=True):
    """(forward, training step) FLOPs per sequence of context g.context: every product has its
    input and weight (or, in attention, both operands') gradients, so a step is 3 forwards."""
    T, C = g.context, g.dim
    attention = 2.0 * C * T * (T + 1) if causal else 4.0 * C * T * T  # QK^T and AV
    fwd = g.layers * (24.0 * T * C * C + attention) + 2.0 * T * C * vocab
    return fwd, 3 * fwd


def flops_per_unit(a, name):
    """Training-step FLOPs per unit of the arms' throughput (a sample; the GPT: a token)."""
    model = name.split("-")[0]
    if model == "gpt":
        return gpt_flops(a.gpt, a.gpt.vocab)[1] / a.gpt.context
    return image_flops(model)[1]


# --- The peak, the CPU --------------------------------------------------------------------------

def measure_peak(a, when):
    p = subprocess.run([a.bench_gemm, "--peak"], capture_output=True, text=True)
    if p.returncode != 0:
        die(f"{a.bench_gemm} --peak exited {p.returncode}: {p.stderr.strip()[-300:]}")
    peak = json.loads(p.stdout.strip().splitlines()[-1])
    bf16 = peak["bf16_gflops"]
    print(f"peak {when}: fp32 {peak['fp32_gflops']:.1f} GFLOP/s ({peak['isa']}), bf16 "
          f"{f'{bf16:.1f} GFLOP/s' if bf16 else 'none (no AVX512_BF16)'}; load "
          f"{bg.load1():.2f}", flush=True)
    a.peaks.append(peak)


def median_peak(a, precision):
    vals = [p[f"{precision}_gflops"] for p in a.peaks if p[f"{precision}_gflops"]]
    return statistics.median(vals) if vals else 0.0


def cpu_line(a):
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True,
                             env=dict(os.environ, LC_ALL="C")).stdout
    except OSError:  # no util-linux
        out = ""
    f = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
    get = lambda k: f.get(k, "?").strip()  # noqa: E731
    version = subprocess.run([a.strata, "--version"], capture_output=True, text=True).stdout
    torch = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True).stdout
    return (f"CPU: {get('Model name')}, family {get('CPU family')}, model {get('Model')}, "
            f"{os.cpu_count()} CPUs; {version.strip() or a.strata}; PyTorch "
            f"{torch.strip() or '?'}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


# --- The arms -----------------------------------------------------------------------------------

def run_arm(a, name, framework):
    model, precision = name.split("-")
    if model == "gpt":
        return bb.gpt_arm(a, framework, precision)  # tokens/s
    if framework == "strata":  # a fresh output directory: nothing to resume from
        shutil.rmtree(os.path.join(a.work, f"{model}-{precision}"), ignore_errors=True)
    return bb.image_arm(a, model, framework, precision)  # samples/s


def bench(a, name):
    unit = "tokens/s" if name.startswith("gpt") else "samples/s"
    per_unit = flops_per_unit(a, name)
    rows = []
    for r in range(a.repeats):
        order = FRAMEWORKS if r % 2 == 0 else FRAMEWORKS[::-1]
        load, t0 = bg.load1(), bg.cpu_ticks()
        got = {fw: run_arm(a, name, fw) for fw in order}
        steal = bg.steal_percent(t0, bg.cpu_ticks())
        rows.append(got)
        print(f"{name} repeat {r + 1} (load {load:.2f}, steal {steal:.1f} %, "
              f"{LABEL[order[0]]} first): " + "; ".join(
                  f"{LABEL[fw]} {got[fw]:.1f} {unit} = {got[fw] * per_unit * 1e-9:.1f} GFLOP/s"
                  for fw in FRAMEWORKS), flush=True)
    return {"unit": unit, "per_unit": per_unit,
            "median": {fw: statistics.median(row[fw] for row in rows) for fw in FRAMEWORKS},
            "ratio": statistics.median(row["strata"] / row["torch"] for row in rows)}


def report(a, results):
    print(f"\nmedians of {a.repeats} repeats; peaks: median of {len(a.peaks)} measurements: "
          f"fp32 {median_peak(a, 'fp32'):.1f}, bf16 {median_peak(a, 'bf16'):.1f} GFLOP/s")
    print(f"{'model':<9} {'arm':<8} {'throughput':>20} {'GFLOP/s':>9} {'of peak':>8}")
    for name, res in results.items():
        peak = median_peak(a, name.split("-")[1])
        gf = {fw: res["median"][fw] * res["per_unit"] * 1e-9 for fw in FRAMEWORKS}
        for fw in FRAMEWORKS:
            share = f"{100 * gf[fw] / peak:7.1f}%" if peak else "      ?"
            print(f"{name:<9} {LABEL[fw]:<8} "
                  f"{res['median'][fw]:>10.1f} {res['unit']:<9} {gf[fw]:9.1f} {share}")
        bound = peak / gf["torch"] if peak and gf["torch"] else float("nan")
        line = (f"{name:<9} strata / PyTorch {res['ratio']:.2f}, bound {bound:.2f} (strata at "
                f"100 % of the peak); step {res['per_unit'] * 1e-6:.3f} MFLOP per "
                f"{res['unit'].split('/')[0][:-1]}")
        if name in TARGET_RATIO:
            t = TARGET_RATIO[name]
            line += f"; issue 34's target >= {t:g}x: {'met' if res['ratio'] >= t else 'not met'}"
        if name in TARGET_SHARE and peak:
            t, s = TARGET_SHARE[name], gf["strata"] / peak
            line += (f"; issue 34's target >= {100 * t:.0f} % of the peak: "
                     f"{'met' if s >= t else 'not met'}")
        print(line, flush=True)
        if name.startswith("gpt") and peak:  # the convention of strata's model line
            full = gpt_flops(a.gpt, a.gpt.vocab, causal=False)[1] / a.gpt.context
            print(f"{name:<9} counting attention's full T x T products instead (as strata's model "
                  f"line does): {full * 1e-6:.3f} MFLOP per token, strata "
                  f"{100 * res['median']['strata'] * full * 1e-9 / peak:.1f} %, PyTorch "
                  f"{100 * res['median']['torch'] * full * 1e-9 / peak:.1f} % of the peak")


# --- The profile --------------------------------------------------------------------------------

# Ordered: a symbol goes to the first category whose pattern it matches (lower-cased name).
CATEGORIES = (
    ("kernel, page faults", None),  # perf's [k] samples
    # bf16 operands rounded (round_col_sums: with the bias gradient's sums), or rounded into
    # the blocked layout the kernels read (pack_block*: rounding and copy in one pass).
    ("bf16 rounding, packing", r"round_span|round_col_sums|to_bf16|pack_block"),
    ("operand copies, reorders", r"copy|reorder|transpos|trans_|im2col|col2im|paddedchunk"),
    # oneDNN's JIT kernels, and strata's own small-row ones (kernels/cpu/small_gemm.cpp: tile,
    # tile_gathered) and few-taps convolution products (conv_few_taps.cpp).
    ("GEMM kernels", r"brgemm_kernel|gemm.*kern|xbyak_gemm|::tile(_gathered)?<|small_gemm|"
                     r"forward_ck<|weight_grad_rows<"),
    ("optimizer", r"adamw|adam_|sgd|momentum|optimizer"),
    ("loader", r"u8_to_unit_float|loader"),
    # gelu, relu, layernorm (forward_rows, backward_rows), softmax, residual, attention's own
    # code (forward_head, backward_head), bias sums: strata's CPU kernels besides the above.
    ("elementwise", r"gelu|relu|layernorm|softmax|residual|attention|eltwise|pool|^strata::cpu::"),
    ("other", r""),
)


def categorize(sym, kernel):
    if kernel:
        return CATEGORIES[0][0]
    low = sym.lower()
    return next(name for name, pat in CATEGORIES[1:] if re.search(pat, low))


def profile_cmd(a, name, out):
    model, precision = name.split("-")
    if model == "gpt":
        g = types.SimpleNamespace(**vars(a.gpt), precision=precision)
        return bg.strata_cmd(g, a.strata, out, g.warmup + g.steps, "none")
    return bb.strata_image_cmd(a, model, precision, out)


def profile(a, name):
    """One strata run of the arm under perf record: shares of its samples by category."""
    out = os.path.join(a.work, f"profile-{name}")
    shutil.rmtree(out, ignore_errors=True)
    data = out + ".perf"
    maps = set(os.listdir("/tmp"))
    env = dict(os.environ, DNNL_JIT_PROFILE="2")  # /tmp/perf-PID.map: the JIT kernels' names
    rec = subprocess.run(["perf", "record", "-F", str(a.perf_freq), "-o", data, "--"] +
                         profile_cmd(a, name, out), capture_output=True, text=True, env=env)
    if rec.returncode != 0:
        print(f"profile {name}: perf record exited {rec.returncode} ({rec.stderr.strip()[-300:]}); "
              "skipped", flush=True)
        return
    rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children", "--sort",
                          "sym", "-q", "--percent-limit", "0"], capture_output=True, text=True)
    for m in set(os.listdir("/tmp")) - maps:  # the maps this run wrote
        if re.fullmatch(r"perf-\d+\.map", m):
            os.remove(os.path.join("/tmp", m))
    shares, syms = collections.Counter(), collections.Counter()
    for ln in rep.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*\S)", ln)
        if m:
            pct, sym = float(m.group(1)), m.group(3)
            cat = categorize(sym, m.group(2) == "k")
            shares[cat] += pct
            syms[cat, sym[:60]] += pct
    n = re.search(r"\((\d+) samples\)", rec.stderr)
    print(f"profile {name} ({n.group(1) if n else '?'} samples): " + ", ".join(
        f"{cat} {shares[cat]:.1f} %" for cat, _ in CATEGORIES), flush=True)
    for cat in ("GEMM kernels", "operand copies, reorders", "elementwise", "other"):
        top = sorted(((p, s) for (c, s), p in syms.items() if c == cat), reverse=True)[:4]
        if top:
            print(f"  {cat}: " + "; ".join(f"{s} {p:.1f} %" for p, s in top))


# --- --check-flops ------------------------------------------------------------------------------

def strata_mflop(a, flags, tag):
    out = os.path.join(a.work, f"check-{tag}")
    shutil.rmtree(out, ignore_errors=True)
    cmd = [a.strata, "train", *flags, "--train.max_steps", "1", "--threads", "1", "--device",
           "cpu", "--output.dir", out, "--checkpoint.final", "false", "--watchdog.timeout_s", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"([\d.]+) MFLOP per sample forward", p.stdout)
    v = re.search(r"LM head \(vocab (\d+)", p.stdout)
    if p.returncode != 0 or not m:
        die(f"{' '.join(cmd)} exited {p.returncode} without its model line: {p.stderr[-300:]}")
    return float(m.group(1)), int(v.group(1)) if v else None


def check_flops(a):
    bad = 0
    cases = [("mlp", None, None), ("mlp", [1280, 640], None), ("cnn", None, None),
             ("cnn", [1280], [8, 16])]
    for model, hidden, channels in cases:
        flags = ["--config", os.path.join(ROOT, "configs", f"fmnist_{model}.toml"),
                 "--data.path", a.mnist]
        flags += ["--model.hidden", *map(str, hidden)] if hidden else []
        flags += ["--model.channels", *map(str, channels)] if channels else []
        theirs = strata_mflop(a, flags, model)[0]
        ours = image_flops(model, hidden, channels)[0] * 1e-6
        tag = f"{model} hidden {hidden or 'as shipped'} channels {channels or 'as shipped'}"
        bad += report_check(tag, ours, theirs)
    g = types.SimpleNamespace(layers=2, heads=2, dim=32, context=32)
    flags = ["--data.path", a.text, "--model.type", "gpt", "--model.layers", str(g.layers),
             "--model.heads", str(g.heads), "--model.dim", str(g.dim), "--model.context",
             str(g.context), "--train.batch_size", "2"]
    theirs, vocab = strata_mflop(a, flags, "gpt")
    final_ln = 8.0 * g.context * g.dim  # strata counts the final LayerNorm (not the blocks')
    ours = (gpt_flops(g, vocab, causal=False)[0] + final_ln) * 1e-6
    bad += report_check(f"gpt {g.layers} blocks dim {g.dim} context {g.context} vocab {vocab}",
                        ours, theirs)
    print(f"check-flops: {'all agree' if not bad else f'{bad} differ'}")
    return 1 if bad else 0


def report_check(tag, ours, theirs):
    ok = abs(ours - theirs) <= 0.005 + 1e-9  # strata prints two decimals
    print(f"check-flops: {tag}: this script {ours:.4f}, strata {theirs:.2f} MFLOP per sample "
          f"forward: {'agree' if ok else 'DIFFER'}")
    return 0 if ok else 1


# --- main ---------------------------------------------------------------------------------------

def parse_models(text):
    names = []
    for n in text.split(","):
        model, _, precision = n.strip().partition("-")
        if model not in ("mlp", "cnn", "gpt") or precision not in ("", "fp32", "bf16"):
            die(f"--models: {n!r} is not mlp, cnn or gpt, optionally with -fp32 or -bf16")
        names.append(f"{model}-{precision or 'fp32'}")
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--bench-gemm", help="default: benchmarks/bench_gemm beside --strata")
    ap.add_argument("--mnist", default=os.path.join(ROOT, "data", "fashion-mnist.h5"))
    ap.add_argument("--text", default=os.path.join(ROOT, "data", "fortunes-bench.h5"))
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter with torch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn,gpt-bf16,gpt-fp32")
    ap.add_argument("--work", default="/tmp/strata-bench-roofline", help="run directories")
    ap.add_argument("--profile", action="store_true", help="then each strata arm under perf")
    ap.add_argument("--profile-only", action="store_true", help="the profiles alone")
    ap.add_argument("--perf-freq", type=int, default=1999, help="perf record's samples/s")
    ap.add_argument("--check-flops", action="store_true",
                    help="compare the forward FLOPs with strata's model line, then exit")
    a = ap.parse_args()
    a.strata = os.path.abspath(a.strata)
    if not os.access(a.strata, os.X_OK):
        die(f"no strata binary at {a.strata} (build it, or pass --strata)")
    os.makedirs(a.work, exist_ok=True)
    if a.check_flops:
        return check_flops(a)
    a.bench_gemm = a.bench_gemm or os.path.join(os.path.dirname(a.strata), "benchmarks", "bench_gemm")
    if not a.profile_only and not os.access(a.bench_gemm, os.X_OK):
        die(f"no bench_gemm at {a.bench_gemm} (it measures the peak; build it beside --strata, "
            "or pass --bench-gemm)")
    names = parse_models(a.models)
    a.gpt = bb.gpt_settings(a)
    if any(n.startswith("gpt") for n in names):
        bg.prepare_data(a.gpt)
    print(cpu_line(a), flush=True)
    a.peaks, results = [], {}
    if not a.profile_only:
        for name in names:
            measure_peak(a, f"before {name}")
            results[name] = bench(a, name)
        measure_peak(a, "after the last model")
        report(a, results)
    if a.profile or a.profile_only:
        if not shutil.which("perf"):
            print("profile: no perf on this machine (linux-perf); skipped")
            return 0
        for name in names:
            profile(a, name)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
