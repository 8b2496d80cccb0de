#!/usr/bin/python3
"""Data-parallel steps of two strata builds side by side: the gradient sums' cost (issue 32's
ZeRO-2 miss; src/comm/pairwise.h against Open MPI's libnbc sums of the build before it).

For each case (the shipped MLP, CNN and GPT configs on 2 ranks of this node, ZeRO 0, 1 and 2),
runs the baseline build and the build under test in turn, --repeats times (which goes first
alternates), and prints per build the step time (train_time_s / steps of the `done` event) and
the exposed gradient sums per step (allreduce_exposed_s / steps: rank 0's training thread in
the sums outside backward), each as the median and the least of the repeats, and the ratio of
the medians. On a shared machine a displaced rank only adds time, so the least is the steadier
figure; both are printed.

    bench_dp_sums.py --baseline OLD_STRATA --strata NEW_STRATA --mnist build/test-data/fashion-mnist.h5
        --text build/test-data/fortunes.h5 [--repeats 5] [--cases mlp-d2,mlp-z1,...] [--out FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
CASES = {  # name: (config, data key, steps, flags)
    "mlp-d2": ("fmnist_mlp.toml", "mnist", 3000, []),
    "mlp-z1": ("fmnist_mlp.toml", "mnist", 3000, ["--parallel.zero", "1"]),
    "mlp-z2": ("fmnist_mlp.toml", "mnist", 3000, ["--parallel.zero", "2"]),
    "cnn-d2": ("fmnist_cnn.toml", "mnist", 300, []),
    "cnn-z2": ("fmnist_cnn.toml", "mnist", 300, ["--parallel.zero", "2"]),
    "gpt-d2": ("gpt_fortunes.toml", "text", 60, []),
    "gpt-z2": ("gpt_fortunes.toml", "text", 60, ["--parallel.zero", "2"]),
}


def run(a, strata, case):
    cfg, data, steps, flags = CASES[case]
    out = os.path.join(a.work, "run")
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mpirun", "-n", "2", "--bind-to", "core", strata, "train", "--quiet", "--threads", "1",
           "--device", "cpu", "--config", os.path.join(ROOT, "configs", cfg), "--data.path",
           getattr(a, data), "--train.max_steps", str(steps), "--checkpoint.final", "false",
           "--output.dir", out] + flags
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-2000:]}")
    done = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"done"' in l][-1]
    return done["train_time_s"] / done["step"], done["allreduce_exposed_s"] / done["step"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True, help="the strata build to compare against")
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--mnist", default=os.path.join(ROOT, "build", "test-data", "fashion-mnist.h5"))
    ap.add_argument("--text", default=os.path.join(ROOT, "build", "test-data", "fortunes.h5"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--work", default="/tmp/bench-dp-sums")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [f"# bench_dp_sums.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu}, "
             f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; 2 ranks, 1 thread each; "
             f"{a.repeats} repeats, alternating",
             f"# baseline {a.baseline}; under test {a.strata}",
             f"{'case':8} {'build':9} {'ms/step median':>15} {'least':>8} {'exposed ms median':>18} {'least':>8}"]
    print("\n".join(lines), flush=True)
    for case in a.cases.split(","):
        if case not in CASES:
            sys.exit(f"--cases: unknown case {case} ({', '.join(CASES)})")
        res = {"baseline": [], "test": []}
        for r in range(a.repeats):
            order = [("baseline", a.baseline), ("test", a.strata)]
            for name, binary in order if r % 2 == 0 else order[::-1]:
                res[name].append(run(a, binary, case))
        med = {k: statistics.median(s for s, _ in v) for k, v in res.items()}
        for name in ("baseline", "test"):
            steps, exposed = [s for s, _ in res[name]], [e for _, e in res[name]]
            lines.append(f"{case:8} {name:9} {1e3 * statistics.median(steps):15.3f} {1e3 * min(steps):8.3f} "
                         f"{1e3 * statistics.median(exposed):18.3f} {1e3 * min(exposed):8.3f}")
            print(lines[-1], flush=True)
        lines.append(f"{case:8} test / baseline, median step: {med['test'] / med['baseline']:.3f}x")
        print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
