#!/usr/bin/python3
"""GPT training speed: strata against PyTorch on one CPU thread, and recompute's memory saving.

    benchmarks/bench_gpt.py [--strata build/strata] [--steps 10] [--warmup 2] [--repeats 3]

The model (GPT-2's shape: 6 blocks, dim 384, 6 heads, context 256, byte-level vocab 256, no
dropout) and the optimizer (AdamW, constant lr, weight decay on every parameter, no clipping)
are the same in both frameworks, as are the data (Debian's fortunes, prepared by
`strata prepare text`; PyTorch reads the token file strata reads) and the batch (8 sequences of
256 tokens). strata runs with --threads 1; PyTorch with torch.set_num_threads(1) and a
one-thread OpenBLAS (see torch_baseline.py, whose backend report this reuses).

Parts:
  1. Speed. R repeats, each one strata run and one PyTorch run (their order alternates between
     repeats, so drift in the machine's load hits both). A run trains WARMUP + STEPS steps;
     tokens/s is STEPS x batch x context over the time of the STEPS steps after the warm-up.
     strata's comes from its metrics.jsonl (log_every 1: each step line's time_s); the `done`
     event's samples_per_s x context, which includes the warm-up steps, is printed beside it.
     Before any figure is used, each run's losses are checked: the first near log(vocab)
     (GPT-2's init gives near-uniform predictions), falling, and the two frameworks' later
     losses (median of the second half) within 0.3 nats (same model, optimizer and data;
     different draws of the initial weights and of the batches). Reported: the median
     tokens/s of each, the ratio of the medians and the median of the per-repeat ratios, and
     PASS/FAIL against --target (the issue's 1.5).
  2. Memory. strata's peak resident set size (getrusage of the child, via os.wait4) for a few
     steps with --train.recompute none and block, beside the activations the blocks keep
     (computed from the shapes: what recompute should save).

The 1-minute load average before every run and the share of CPU time stolen by the hypervisor
during it (/proc/stat) are printed: on a shared VM they say how much the figures can be trusted. --max-load waits (up to --max-wait seconds) for it to fall first.
Exit status: 0, or 1 with --strict when the target is missed; 2 for a failed run or check.
"""
import argparse
import glob
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FORTUNES = "/usr/share/games/fortunes"


def die(msg):
    print(f"bench_gpt.py: error: {msg}", file=sys.stderr)
    sys.exit(2)


def note(msg):
    print(f"bench_gpt.py: {msg}", file=sys.stderr, flush=True)


# --- PyTorch side (runs in a child process: `bench_gpt.py --torch-worker ...`) ----------------

def torch_worker(a):
    """Trains the GPT in PyTorch and prints one JSON line: per-step losses and times."""
    sys.path.insert(0, HERE)
    import torch_baseline as tb  # sets OPENBLAS_CORETYPE/OPENBLAS_NUM_THREADS, imports torch
    import h5py
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    info = tb.report_backends()
    tb.require_openblas(info["openblas_core"], info["openblas_threads"], a.threads)
    V, C, NH, T, L = a.vocab, a.dim, a.heads, a.context, a.layers

    # nanoGPT's model, the one the GPT parity test checks strata against, with GPT-2's init
    # as strata's: zero biases, N(0, 0.02) weights, the residual projections / sqrt(2 L).
    sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
    from torch_gpt_model import gpt
    model = gpt(V, C, NH, T, L)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                proj = n.endswith("c_proj.weight")
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if proj else 0.02)

    with h5py.File(a.data, "r") as f:  # the whole split in memory, before timing
        tokens = torch.from_numpy(f["train/tokens"][...].astype(np.int64))
    n = (tokens.numel() - 1) // T  # windows tokens[i*T, i*T + T + 1), as strata's loader
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay)
    gen = torch.Generator().manual_seed(a.seed)
    offsets = torch.arange(T + 1)
    perm, at = torch.randperm(n, generator=gen), 0
    losses, times = [], []
    model.train()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(a.warmup + a.steps):
        if at + a.batch > n:
            perm, at = torch.randperm(n, generator=gen), 0
        w = tokens[(perm[at:at + a.batch] * T)[:, None] + offsets]  # (B, T+1), in the loop
        at += a.batch
        x, y = w[:, :-1], w[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(model(x).view(-1, V), y.reshape(-1))  # mean over B*T
        loss.backward()
        opt.step()
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
    cpu_s = time.process_time() - cpu0  # all steps, as strata's train_thread_cpu_s
    print(json.dumps({"losses": losses, "time_s": times, "cpu_s": cpu_s, "torch": torch.__version__,
                      "openblas_core": info["openblas_core"],
                      "params": sum(p.numel() for p in model.parameters())}))
    return 0


# --- Driver -----------------------------------------------------------------------------------

def load1():
    return os.getloadavg()[0]


def cpu_ticks():
    """(steal, total) jiffies of all CPUs, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[7], sum(v)


def steal_percent(t0, t1):
    """The share of the CPUs' time the hypervisor gave to other guests between two cpu_ticks()."""
    return 100.0 * (t1[0] - t0[0]) / max(t1[1] - t0[1], 1)


def wait_for_load(max_load, max_wait):
    if max_load <= 0:
        return
    t0 = time.time()
    while load1() > max_load and time.time() - t0 < max_wait:
        time.sleep(10)
    if load1() > max_load:
        note(f"load average still {load1():.2f} > {max_load} after {max_wait} s; going on")


def run_child(cmd, env=None, log=None):
    """Runs cmd; returns (exit status, stdout, peak RSS in MiB of that child alone)."""
    with open(log or os.devnull, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, text=True)
        out = p.stdout.read()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, out, ru.ru_maxrss / 1024.0  # ru_maxrss is in KiB on Linux


def prepare_data(a):
    if os.path.exists(a.data):
        return
    files = sorted(f for f in glob.glob(os.path.join(FORTUNES, "*"))
                   if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
    if not files:
        die(f"no fortunes in {FORTUNES}: apt-get install -y fortunes (or pass --data)")
    os.makedirs(os.path.dirname(os.path.abspath(a.data)), exist_ok=True)
    # A validation split of a few windows only: strata evaluates it after every run, which at
    # the default 10% (190 k tokens) would add about a minute to each.
    cmd = [a.strata, "prepare", "text", "--input", *files, "--out", a.data,
           "--val_fraction", "0.001"]
    note("preparing " + a.data)
    if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
        die("strata prepare text failed: " + " ".join(cmd))


def strata_cmd(a, strata, out, steps, recompute):
    return [strata, "train", "--data.path", a.data, "--model.type", "gpt",
            "--model.layers", str(a.layers), "--model.heads", str(a.heads),
            "--model.dim", str(a.dim), "--model.context", str(a.context), "--model.dropout", "0",
            "--train.batch_size", str(a.batch), "--train.optimizer", "adamw",
            "--train.lr", str(a.lr), "--train.weight_decay", str(a.weight_decay),
            "--train.beta1", "0.9", "--train.beta2", "0.999", "--train.eps", "1e-8",
            "--train.lr_schedule", "constant", "--train.warmup_steps", "0",
            "--train.grad_clip", "0", "--train.epochs", "1000", "--train.max_steps", str(steps),
            "--train.log_every", "1", "--train.seed", str(a.seed),
            "--train.recompute", recompute, "--threads", "1", "--device", "cpu",
            "--checkpoint.final", "false", "--watchdog.timeout_s", "0",
            "--train.precision", a.precision, "--output.dir", out, "--quiet"]


def run_strata(a, tag, steps, recompute="none", strata=None):
    out = os.path.join(a.work, tag)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    rc, _, rss = run_child(strata_cmd(a, strata or a.strata, out, steps, recompute),
                           log=out + ".log")
    if rc != 0:
        die(f"strata failed ({rc}); see {out}.log")
    lines = [json.loads(ln) for ln in open(os.path.join(out, "metrics.jsonl")) if ln.strip()]
    step_lines = {int(d["step"]): d for d in lines if "event" not in d and "time_s" in d}
    done = [d for d in lines if d.get("event") == "done"]
    if len(step_lines) != steps or not done:
        die(f"{out}/metrics.jsonl: expected {steps} step lines and a done event")
    return {"losses": [step_lines[s]["loss"] for s in range(1, steps + 1)],
            "time_s": [step_lines[s]["time_s"] for s in range(1, steps + 1)],
            "done_tokens_per_s": done[-1]["samples_per_s"] * a.context, "rss_mib": rss,
            "cpu_s": done[-1]["train_thread_cpu_s"]}


def run_torch(a):
    cmd = [a.python, os.path.abspath(__file__), "--torch-worker", "--data", a.data,
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
           "--lr", str(a.lr), "--weight-decay", str(a.weight_decay), "--seed", str(a.seed),
           "--threads", "1", "--vocab", str(a.vocab), "--layers", str(a.layers),
           "--heads", str(a.heads), "--dim", str(a.dim), "--context", str(a.context),
           "--precision", a.precision]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    log = os.path.join(a.work, "torch.log")
    rc, out, rss = run_child(cmd, env=env, log=log)
    if rc != 0:
        die(f"the PyTorch run failed ({rc}); see {log}")
    r = json.loads(out.strip().splitlines()[-1])
    r["rss_mib"] = rss
    return r


def steady_tokens_per_s(a, r):
    """tokens/s over the STEPS steps after the warm-up."""
    return a.steps * a.batch * a.context / (r["time_s"][-1] - r["time_s"][a.warmup - 1])


def cpu_tokens_per_s(a, r):
    """tokens per second of CPU time over all steps (warm-up included): blind to time the
    hypervisor steals, not to a neighbour sharing the physical core."""
    return (a.warmup + a.steps) * a.batch * a.context / r["cpu_s"]


def check_losses(a, name, losses):
    # The median of the second half: some 8-window batches (ASCII art) cost ~1 nat more.
    first, last = losses[0], statistics.median(losses[len(losses) // 2:])
    if abs(first - math.log(a.vocab)) > 0.5:  # measured 5.46 to 5.73 over seeds
        die(f"{name}: first loss {first:.4f}, expected ~log({a.vocab}) = {math.log(a.vocab):.4f}")
    if not last < first - 0.5:
        die(f"{name}: losses do not fall ({first:.4f} -> {last:.4f})")
    return last


def activation_mib(a):
    """What each block keeps for backward (src/model/layers_gpt.cpp Block::Acts), in MiB: ln1, qkv,
    y, res1, ln2, fc, fc gelu (1+3+1+1+1+4+4 = 15 NC), the attention probabilities
    (B NH T T) and two LayerNorms' stats (4 N); N = B T rows."""
    N = a.batch * a.context
    return (15 * N * a.dim + a.batch * a.heads * a.context ** 2 + 4 * N) * 4 / 2 ** 20


def compare_builds(a):
    """--baseline-strata: the speed part with another strata build in PyTorch's place, alternating
    as there; the way to tell a change of a few percent from this shared machine's drift."""
    rows = []
    for r in range(a.repeats):
        res = {}
        for which in (("new", "base") if r % 2 == 0 else ("base", "new")):
            wait_for_load(a.max_load, a.max_wait)
            res[which] = run_strata(a, "speed-" + which, a.warmup + a.steps,
                                    strata=a.strata if which == "new" else a.baseline_strata)
            check_losses(a, which, res[which]["losses"])
        n, b = steady_tokens_per_s(a, res["new"]), steady_tokens_per_s(a, res["base"])
        rows.append((n, b, n / b))
        print(f"repeat {r + 1}: {a.strata} {n:7.1f} tokens/s   {a.baseline_strata} {b:7.1f} "
              f"tokens/s   ratio {n / b:.3f}", flush=True)
    print(f"median of {a.repeats}: {statistics.median(x[0] for x in rows):.1f} against "
          f"{statistics.median(x[1] for x in rows):.1f} tokens/s; median ratio "
          f"{statistics.median(x[2] for x in rows):.3f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "fortunes-bench.h5"))
    ap.add_argument("--work", default="/tmp/strata-bench-gpt", help="run directories")
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter with torch")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: strata's train.precision bf16 against torch.autocast bf16")
    ap.add_argument("--target", type=float, default=1.5, help="strata / PyTorch tokens/s, at least")
    ap.add_argument("--memory-steps", type=int, default=3, help="steps of each memory run")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--max-load", type=float, default=0, help="wait for a 1-min load <= this")
    ap.add_argument("--max-wait", type=float, default=600)
    ap.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    ap.add_argument("--baseline-strata", help="compare --strata with this strata build, not "
                    "PyTorch (speed only)")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)
    if a.warmup < 1 or a.steps < 1:
        die("--warmup and --steps must be at least 1")
    a.strata = os.path.abspath(a.strata)
    for b in (a.strata, a.baseline_strata):
        if b and not os.access(b, os.X_OK):
            die(f"no strata binary at {b} (build it, or pass --strata)")
    if a.baseline_strata:
        a.baseline_strata = os.path.abspath(a.baseline_strata)
    os.makedirs(a.work, exist_ok=True)
    prepare_data(a)
    print(f"GPT: {a.layers} blocks, dim {a.dim}, {a.heads} heads, context {a.context}, vocab "
          f"{a.vocab}; batch {a.batch} x {a.context} tokens, AdamW lr {a.lr} wd "
          f"{a.weight_decay}; {a.warmup} warm-up + {a.steps} timed steps, one thread; "
          f"{os.cpu_count()} CPUs", flush=True)

    if a.baseline_strata:
        return compare_builds(a)

    status = 0
    if not a.no_speed:
        rows = []
        for r in range(a.repeats):
            res = {}
            for which in (("strata", "torch") if r % 2 == 0 else ("torch", "strata")):
                wait_for_load(a.max_load, a.max_wait)
                load, t0 = load1(), cpu_ticks()
                res[which] = (run_strata(a, "speed", a.warmup + a.steps) if which == "strata"
                              else run_torch(a))
                res[which]["load"] = load
                res[which]["steal"] = steal_percent(t0, cpu_ticks())
            s, t = res["strata"], res["torch"]
            ls = check_losses(a, "strata", s["losses"])
            lt = check_losses(a, "pytorch", t["losses"])
            if abs(ls - lt) > 0.3:  # measured within 0.15 (different draws of init and data)
                die(f"the last losses differ: strata {ls:.4f}, PyTorch {lt:.4f}")
            st, tt = steady_tokens_per_s(a, s), steady_tokens_per_s(a, t)
            cs, ct = cpu_tokens_per_s(a, s), cpu_tokens_per_s(a, t)
            rows.append((st, tt, st / tt, cs / ct))
            print(f"repeat {r + 1}: strata {st:7.1f} tokens/s (done event {s['done_tokens_per_s']:.1f}; "
                  f"load {s['load']:.2f}, steal {s['steal']:.0f}%; loss {s['losses'][0]:.3f} -> "
                  f"{ls:.3f})   PyTorch {tt:7.1f} tokens/s (load {t['load']:.2f}, steal "
                  f"{t['steal']:.0f}%; loss {t['losses'][0]:.3f} -> {lt:.3f})   ratio {st / tt:.2f} "
                  f"(per CPU second: {cs:.0f} / {ct:.0f} = {cs / ct:.2f})", flush=True)
        ms = statistics.median(x[0] for x in rows)
        mt = statistics.median(x[1] for x in rows)
        mr = statistics.median(x[2] for x in rows)
        mc = statistics.median(x[3] for x in rows)
        print(f"median of {a.repeats}: strata {ms:.1f} tokens/s, PyTorch {mt:.1f} tokens/s "
              f"({res['torch']['torch']}, OpenBLAS {res['torch']['openblas_core'] or '?'}); "
              f"ratio of medians {ms / mt:.2f}, median ratio {mr:.2f} (per CPU second {mc:.2f})")
        print(f"peak RSS of the speed runs: strata {res['strata']['rss_mib']:.0f} MiB, PyTorch "
              f"{res['torch']['rss_mib']:.0f} MiB")
        ok = mr >= a.target
        print(f"strata / PyTorch tokens/s >= {a.target}: {'PASS' if ok else 'FAIL'} ({mr:.2f})",
              flush=True)
        if not ok and a.strict:
            status = 1

    if not a.no_memory:
        rss = {}
        for rc in ("none", "block"):
            wait_for_load(a.max_load, a.max_wait)
            rss[rc] = run_strata(a, f"memory-{rc}", a.memory_steps, rc)["rss_mib"]
        act = activation_mib(a)
        print(f"strata peak RSS, {a.memory_steps} steps: recompute none {rss['none']:.0f} MiB, "
              f"block {rss['block']:.0f} MiB: saves {rss['none'] - rss['block']:.0f} MiB "
              f"({100 * (1 - rss['block'] / rss['none']):.0f}%); the blocks' stored activations "
              f"are {a.layers} x {act:.0f} = {a.layers * act:.0f} MiB, of which recompute keeps "
              f"one set: expected saving {(a.layers - 1) * act:.0f} MiB")
        ok = rss["none"] - rss["block"] >= 0.5 * (a.layers - 1) * act
        print(f"recompute saves at least half of that: {'PASS' if ok else 'FAIL'}", flush=True)
        if not ok and a.strict:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
