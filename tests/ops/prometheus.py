"""strata's Prometheus file read back through Debian's prometheus-node-exporter.

A 2-rank run writes --prometheus DIR/strata.prom; node_exporter (textfile collector only, on a
free localhost port) serves DIR; every series strata writes must come back from /metrics with
the labels slurm_job_id and run, the values strata wrote (step, loss against metrics.jsonl) and
no textfile scrape error. Then slurm/grafana-strata.json must parse and name only series strata
writes. Usage: prometheus.py STRATA DATA WORKDIR DASHBOARD"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "mpi"))
from common import MPI_ENV, metrics, run_strata  # noqa: E402

strata, data, work, dashboard = sys.argv[1:5]
EXPORTER = "/usr/bin/prometheus-node-exporter"


def fail(msg):
    sys.exit(f"FAIL: {msg}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url, timeout=15):
    t0 = time.time()
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except OSError as e:
            if time.time() - t0 > timeout:
                fail(f"{url} did not answer within {timeout} s ({e})")
            time.sleep(0.2)


def samples(text):
    """{(name, frozenset(labels)): value} of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)', line)
        if not m or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


if not os.path.exists(EXPORTER):
    fail(f"{EXPORTER} is missing: install the Debian package prometheus-node-exporter (./dev test does)")
work = os.path.join(work, "prometheus")
shutil.rmtree(work, ignore_errors=True)
prom_dir = os.path.join(work, "textfiles")
os.makedirs(prom_dir)
out = os.path.join(work, "myrun")
env_note = {"SLURM_JOB_ID": "4242", "STRATA_JOB_END_TIME": str(int(time.time()) + 3600)}
os.environ.update(env_note)
MPI_ENV.update(env_note)
run_strata(strata, 2, ["train", "--data.path", data, "--model.hidden", "32", "--train.max_steps", "300",
                       "--train.log_every", "50", "--checkpoint.every_steps", "100", "--output.dir", out,
                       "--prometheus", os.path.join(prom_dir, "strata.prom"), "--progress", "off"])
written = open(os.path.join(prom_dir, "strata.prom")).read()
leftovers = [f for f in os.listdir(prom_dir) if f != "strata.prom"]
if leftovers:
    fail(f"temporary files left in {prom_dir}: {leftovers}")

port = free_port()
exporter = subprocess.Popen([EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                             f"--collector.textfile.directory={prom_dir}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
try:
    served = scrape(f"http://127.0.0.1:{port}/metrics")
finally:
    exporter.terminate()
    exporter.wait(timeout=10)

got, mine = samples(served), samples(written)
errors = [v for (n, _), v in got.items() if n == "node_textfile_scrape_error"]
if errors != [0.0]:
    fail(f"node_textfile_scrape_error = {errors} (node_exporter could not parse strata's file)")
names_written = {n for n, _ in mine}
labels = {("slurm_job_id", "4242"), ("run", "myrun")}
for key, value in mine.items():
    if key not in got:
        fail(f"{key[0]}{dict(key[1])} is in the file strata wrote but not in node_exporter's /metrics")
    if not labels <= key[1]:
        fail(f"{key[0]} lacks the labels {labels}: {dict(key[1])}")
    if abs(got[key] - value) > 1e-12 * max(1.0, abs(value)):
        fail(f"{key[0]}: node_exporter serves {got[key]}, strata wrote {value}")
by_name = {n: v for (n, l), v in got.items() if ("run", "myrun") in l}
last = [m for m in metrics(os.path.join(out, "metrics.jsonl")) if "event" not in m][-1]
if by_name.get("strata_step") != 300 or by_name.get("strata_step") != last["step"]:
    fail(f"strata_step = {by_name.get('strata_step')}, the run logged step {last['step']}")
if abs(by_name["strata_loss"] - last["loss"]) > 1e-6 * abs(last["loss"]):
    fail(f"strata_loss = {by_name['strata_loss']}, metrics.jsonl says {last['loss']}")
# Checkpoints are written in the background: the one of step 300 finishes after the last
# update, and the file is rewritten when the run drains it.
if by_name.get("strata_checkpoint_step") != 300 or not by_name.get("strata_checkpoint_bytes", 0) > 0:
    fail(f"the newest checkpoint: step {by_name.get('strata_checkpoint_step')}, "
         f"{by_name.get('strata_checkpoint_bytes')} bytes (expected the one of step 300, "
         f"drained at the end of the run)")
# The interval's figures, as the last metrics line's: samples/s the same, step time x samples/s
# = the global batch (64), no tokens for a classifier, the exposed allreduce a time per step.
sps = by_name.get("strata_samples_per_second", -1)
if abs(sps - last["samples_per_s"]) > 1e-6 * last["samples_per_s"]:
    fail(f"strata_samples_per_second = {sps}, metrics.jsonl says {last['samples_per_s']}")
if abs(by_name.get("strata_step_seconds", 0) * sps - 64) > 1e-6 * 64:
    fail(f"strata_step_seconds = {by_name.get('strata_step_seconds')} is not the interval's mean "
         f"step time (x {sps} samples/s should be the batch of 64)")
if by_name.get("strata_tokens_per_second") != 0:
    fail(f"strata_tokens_per_second = {by_name.get('strata_tokens_per_second')} for a classifier")
exposed = by_name.get("strata_allreduce_exposed_seconds", -1)
if not 0 <= exposed < by_name["strata_step_seconds"]:
    fail(f"strata_allreduce_exposed_seconds = {exposed}: not a share of a step's "
         f"{by_name['strata_step_seconds']} s")
if not 0 < by_name.get("strata_goodput_useful_seconds", 0) <= by_name.get("strata_goodput_wall_seconds", 0):
    fail("strata_goodput_useful_seconds is not in (0, strata_goodput_wall_seconds]")
print(f"node_exporter on 127.0.0.1:{port} served {len(mine)} series of {len(names_written)} names "
      f"from strata's file, labels slurm_job_id=4242 run=myrun; step {by_name['strata_step']:.0f}, "
      f"loss {by_name['strata_loss']:.6f}, goodput {by_name['strata_goodput_ratio']:.3f}")

with open(dashboard) as f:
    dash = json.load(f)
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
            "and", "or", "unless"}


def series_in(expr):
    """Series names a PromQL expression (or Grafana's label_values(SERIES, LABEL)) reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)        # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                      # label matchers
    e = re.sub(r"label_values\(\s*([^,()]+?)\s*,[^)]*\)", r"\1", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e)  # grouping labels
    return {t for t in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", e)
            if t not in KEYWORDS and not re.fullmatch(r"\d.*", t)}


named = set()
for e in exprs:
    found = series_in(e)
    if not found:
        fail(f"dashboard expression names no series: {e}")
    named |= found
unknown = named - names_written
if unknown:
    fail(f"{dashboard} names series strata does not write: {sorted(unknown)}")
unused = names_written - named
if unused:
    fail(f"{dashboard} graphs no panel for {sorted(unused)}")
print(f"{dashboard}: {len(dash['panels'])} panels over {len(named)} series, all written by strata")
print("PASS")
