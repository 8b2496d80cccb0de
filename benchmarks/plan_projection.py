#!/usr/bin/python3
"""Projections for docs/planning.md: GPT-2 1.5B (configs/gpt2_xl.toml) and a 7B-class GPT
(configs/gpt_7b.toml) on 64, 512 and 4,096 H100s, from the cluster description
configs/clusters/h100-nvlink4-ndr400.toml, by `strata plan --json` (nothing is trained: plan
takes the shapes from the configs). For each: the best grid that fits, its memory per GPU, its
predicted step time and tokens/s, and the model FLOPs utilisation that implies, beside the
published figures of comparable runs (named below with their sources). The assumptions plan
prints come with the table.

    benchmarks/plan_projection.py [--strata build/strata] [--write-docs]
        [--out benchmarks/results/DATE-plan-projection.md] [--check-docs]

--write-docs replaces the table between the markers in docs/planning.md (the page's table is
this script's output, never typed); --check-docs only says whether it still is (a test)."""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLUSTER = "configs/clusters/h100-nvlink4-ndr400.toml"
MODELS = [("GPT-2 1.5B (gpt2-xl)", "configs/gpt2_xl.toml"), ("7B-class GPT (dim 4096, 32 layers)", "configs/gpt_7b.toml")]
GPUS = [64, 512, 4096]
PEAK_BF16 = 989e12  # H100 SXM dense bf16, as the cluster file says
BEGIN = "<!-- projection table: benchmarks/plan_projection.py --write-docs -->"
END = "<!-- end of projection table -->"

# Published figures of comparable runs, with their sources (read, not derived here).
PUBLISHED = [
    ("Narayanan et al. 2021 (Megatron-LM), arXiv 2104.04473, abstract", "GPT of 1 trillion parameters, 3,072 A100s, seq 2048",
     "502 petaFLOP/s: 163 TFLOP/s per GPU, 52 % of the A100's 312"),
    ("torchtitan docs/performance.md, Table 1", "Llama 3.1 8B, FSDP, 8 H100s, local batch 2, bf16",
     "5,762 tokens/s per GPU (33-39 % MFU on 8 or 128 H100s without Float8)"),
    ("torchtitan docs/performance.md, Table 3", "Llama 3.1 8B, FSDP, 128 H100s, local batch 2, bf16",
     "5,605 tokens/s per GPU"),
]


def flops_per_token(params, layers, dim, context):
    """Training FLOPs per token: 6 N for the weights' GEMMs (forward and backward) plus the
    attention scores' 12 L d T (Narayanan et al. 2021's count without recompute)."""
    return 6 * params + 12 * layers * dim * context


def model_shape(strata, config):
    get = lambda k: subprocess.run([strata, "config", "--get", k, "--config", config], cwd=ROOT,
                                   capture_output=True, text=True, check=True).stdout.strip()
    return int(get("model.layers").strip("[]\"")), int(get("model.dim")), int(get("model.context"))


def plan(strata, config, gpus):
    p = subprocess.run([strata, "plan", "--config", config, "--nodes", str(gpus // 8), "--ranks_per_node", "8",
                        "--comm", CLUSTER, "--json"], cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"strata plan failed for {config} on {gpus}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def grid_text(keys, d):
    s = f"D {d} × P {keys['parallel.pipeline_stages']} × T {keys['parallel.tensor']}, ZeRO {keys['parallel.zero']}"
    if keys["parallel.pipeline_stages"] > 1:
        s += f", {keys['parallel.schedule']}"
        if keys["parallel.schedule"] == "interleaved":
            s += f" v {keys['parallel.virtual_stages']}"
    s += f", M {keys['parallel.microbatches']}"
    if keys["train.recompute"] == "block":
        s += ", recompute"
    return s + ", " + keys["train.precision"]


def table(strata):
    rows, assumptions = [], []
    for name, config in MODELS:
        layers, dim, context = model_shape(strata, config)
        for gpus in GPUS:
            r = plan(strata, config, gpus)
            assumptions = assumptions or r["assumptions"]
            best = next((g for g in r["grids"] if g["fits"]), None)
            fit = sum(g["fits"] for g in r["grids"])
            if best is None:
                rows.append(f"| {name} | {gpus:,} | no grid fits ({len(r['grids'])} checked) | | | | |")
                continue
            mem = best["memory"]["peak_bytes"] / 1e9
            if best["step_time"] is None:
                rows.append(f"| {name} | {gpus:,} | {grid_text(best['keys'], best['data_parallel'])} | {mem:.1f} | untimed | | |")
                continue
            t = best["step_time"]
            tps = best["throughput"]
            mfu = tps * flops_per_token(r["parameters"], layers, dim, context) / (gpus * PEAK_BF16)
            parts = (f"compute {t['compute_s']:.2f}, bubble {t['bubble_s']:.2f}, exposed comm "
                     f"{t['exposed_comm_s']:.2f}, optimizer {t['optimizer_s']:.3f}")
            rows.append(f"| {name} | {gpus:,} | {grid_text(best['keys'], best['data_parallel'])} ({fit} of "
                        f"{len(r['grids'])} fit) | {mem:.1f} | {t['total_s']:.2f} ({parts}) | "
                        f"{tps / gpus:,.0f} | {100 * mfu:.0f} % |")
    head = ("| model | H100s | best grid that fits | memory per GPU, GB | step s (parts) | tokens/s per GPU | MFU |\n"
            "|---|---:|---|---:|---|---:|---:|")
    pub = "\n".join(f"| {src} | {run} | {fig} |" for src, run, fig in PUBLISHED)
    text = (f"{head}\n" + "\n".join(rows) + "\n\nAssumptions (as `strata plan` printed them):\n\n" +
            "\n".join(f"- {a}" for a in assumptions) +
            "\n\nPublished figures of comparable runs:\n\n| source | run | figure |\n|---|---|---|\n" + pub + "\n")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.path.join(ROOT, "build", "strata"))
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--check-docs", action="store_true",
                    help="exit 1 when docs/planning.md's table is not what this build's plan prints")
    ap.add_argument("--out", default=os.path.join(HERE, "results", f"{datetime.date.today()}-plan-projection.md"))
    a = ap.parse_args()
    text = table(os.path.abspath(a.strata))
    page = os.path.join(ROOT, "docs", "planning.md")
    if a.check_docs:  # the page's table, its "Generated" line aside
        m = re.search(re.escape(BEGIN) + r"\nGenerated [^\n]*\n\n(.*?)" + re.escape(END), open(page).read(), flags=re.S)
        if not m or m.group(1) != text:
            sys.exit(f"{page}: the projection table is not what strata plan prints now; "
                     "run benchmarks/plan_projection.py --write-docs\n" + text)
        print(f"{page}: the projection table is strata plan's output")
        return
    stamp = f"Generated {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC by benchmarks/plan_projection.py (strata plan, {CLUSTER}).\n\n"
    print(stamp + text)
    with open(a.out, "w") as f:
        f.write(stamp + text)
    if a.write_docs:
        doc = open(page).read()
        if BEGIN not in doc or END not in doc:
            sys.exit(f"{page}: the projection table's markers are missing")
        doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: BEGIN + "\n" + stamp + text + END, doc, flags=re.S)
        with open(page, "w") as f:
            f.write(doc)


if __name__ == "__main__":
    main()
