#!/usr/bin/python3
"""configs/gpt_fortunes.toml learns more than byte frequencies: after 150 of its 600 steps on
one rank, the validation loss is at least 0.5 nats per token below the unigram entropy of the
training text (3.32 for Debian's fortunes). Then strata generate continues a prompt from the
trained model: the same seed gives the same text, another seed another.

Usage: gpt_fortunes.py STRATA FORTUNES.h5 WORKDIR CONFIG
"""
import os
import shutil
import subprocess
import sys

from common import metrics

strata, data, work, config = sys.argv[1:5]
out = os.path.join(work, "gpt-fortunes")
shutil.rmtree(out, ignore_errors=True)
subprocess.run([strata, "train", "--config", config, "--data.path", data, "--quiet",
                "--train.max_steps", "150", "--output.dir", out], check=True)
done = [m for m in metrics(os.path.join(out, "metrics.jsonl")) if m.get("event") == "done"][0]
val, unigram = done["test_loss"], done["unigram_entropy_nats"]
print(f"validation loss {val:.4f} nats/token after 150 steps; unigram entropy {unigram:.4f}")
ok = val <= unigram - 0.5


def sample(seed):
    p = subprocess.run([strata, "generate", "--checkpoint", os.path.join(out, "model.h5"),
                        "--prompt", "The ", "--tokens", "60", "--temperature", "0.8",
                        "--seed", str(seed)], check=True, capture_output=True)
    return p.stdout


a, b, c = sample(1), sample(1), sample(2)
print("sample:", a.decode("utf-8", "replace").strip())
ok &= a == b and a != c and a.startswith(b"The ") and len(a) == len(b"The ") + 60 + 1
sys.exit(0 if ok else 1)
