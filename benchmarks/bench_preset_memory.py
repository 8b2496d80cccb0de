#!/usr/bin/python3
"""GPT-2 small (model.preset = "gpt2") for one step on the CPU, batch 1 (1024 tokens): the
memory its start-up `plan:` line estimates per rank, beside the peak resident set the run
measures (getrusage of the child: ru_maxrss), for SGD and AdamW (issue 31: within 10 %).

    benchmarks/bench_preset_memory.py [--strata build/strata] [--threads 2] [--repeats 1]
        [--out benchmarks/results/DATE-preset-memory.txt]

The token file (vocab 50257, 8 windows of 1024 tokens, no validation split) is made here with
numpy and h5py: the BPE tokenizer's output is not needed to measure memory. Beside the presets,
in the same run, a tiny GPT (dim 64) measures the runtime's own footprint, which the estimate
takes as a constant (kRuntimeBytes in src/run/memory_estimate.h). The parameter file is
written (part of every run); checkpoint.final is off. Exit status 1 when an estimate is off by
more than 10 %, 2 when a run fails."""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip() + f", {os.cpu_count()} CPUs"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def token_file(path, vocab, tokens):
    rng = np.random.default_rng(31)
    with h5py.File(path, "w") as f:
        f["train/tokens"] = rng.integers(0, vocab, tokens).astype(np.uint16)
        f.attrs["kind"] = "tokens"
        f.attrs["vocab"] = np.int64(vocab)


def peak_rss_mb(strata, args, work, name):
    """One run in its own process: its peak resident set (wait4's rusage, ru_maxrss, in MB of
    1e6 bytes), its `plan:` line and its `done:` line."""
    out = os.path.join(work, name)
    cmd = [strata, "train", *args, "--train.max_steps", "1", "--checkpoint.final", "false",
           "--output.dir", out, "--quiet"]
    with open(out + ".log", "w+") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ENV)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    plan = next((l for l in text.splitlines() if l.startswith("plan: ")), None)
    if p.returncode != 0 or plan is None:
        print(text, file=sys.stderr)
        sys.exit(2)
    done = next((l for l in text.splitlines() if l.startswith("done: ")), "")
    return ru.ru_maxrss * 1024 / 1e6, plan, done  # KiB on Linux


def estimate_mb(plan):
    m = re.search(r"estimated before allocating: ([\d.]+) GB", plan)
    return float(m.group(1)) * 1000 if m else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", f"{datetime.date.today().isoformat()}-preset-memory.txt"))
    a = ap.parse_args()
    lines = [f"bench_preset_memory.py, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
             f"{cpu_name()}, --threads {a.threads}"]
    worst = 0.0
    with tempfile.TemporaryDirectory() as work:
        bpe = os.path.join(work, "bpe.h5")
        token_file(bpe, 50257, 8 * 1024 + 1)
        small = os.path.join(work, "small.h5")
        token_file(small, 256, 8 * 64 + 1)
        base = ["--threads", str(a.threads), "--train.batch_size", "1"]
        runs = [("runtime: tiny GPT (dim 64, 1 block, vocab 256)",
                 base + ["--data.path", small, "--model.type", "gpt", "--model.layers", "1", "--model.dim", "64",
                         "--model.heads", "2", "--model.context", "64"], False)]
        for opt in ("sgd", "adamw"):
            runs.append((f"gpt2, {opt}, batch 1 x 1024 tokens",
                         base + ["--data.path", bpe, "--model.preset", "gpt2", "--train.optimizer", opt], True))
        for i, (name, args, judged) in enumerate(runs):
            rss, plan, done = peak_rss_mb(a.strata, args, work, f"run{i}")
            est = estimate_mb(plan)
            off = (est - rss) / rss
            if judged:
                worst = max(worst, abs(off))
            lines.append(f"{name}: estimate {est:.0f} MB, peak RSS {rss:.0f} MB, estimate/measured "
                         f"{est / rss:.3f}{'' if judged else ' (not judged: the runtime alone)'}")
            lines.append(f"  {plan}")
            lines.append(f"  {done}")
    lines.append(f"largest difference on the presets: {100 * worst:.1f} % (limit 10 %): "
                 f"{'PASS' if worst <= 0.10 else 'FAIL'}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
