#!/usr/bin/env python3
"""A Hugging Face export read by Hugging Face's own library (transformers), not by a model
written here: GPT-2's BPE tokenizer and GPT-2's weights, as a user would load them.

  transformers_client.py STRATA VOCAB_DIR WORKDIR TEXT...

VOCAB_DIR holds GPT-2's encoder.json + vocab.bpe. Steps: `strata prepare text --tokenizer gpt2`
over the TEXT files; a 2-block GPT with GPT-2's tanh GELU and the padded table trained 20 steps
on the CPU; `strata eval --logits`; `strata export --format hf`; then, in transformers:
  - AutoTokenizer.from_pretrained(export) encodes each TEXT file to the ids strata prepared
    (train + validation split of that document), and decodes them back to the file's bytes;
  - GPT2LMHeadModel.from_pretrained(export) (no missing or unexpected keys) gives strata's
    logits on the first test batch within 1e-5 x max|logit|.
Where the Python running it has no transformers (Debian packages none), it reports skipped
(exit 77) with the reason; the GPU check runs it with the PyTorch environment's Python.
"""
import os
import shutil
import subprocess
import sys


def skip(why):
    print(f"skipped: {why}")
    sys.exit(77)


try:
    import h5py
    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer, GPT2LMHeadModel
except ImportError as e:
    skip(f"no {e.name} in {sys.executable} (transformers is not packaged by Debian)")

if len(sys.argv) < 5:
    print(__doc__)
    sys.exit(2)
strata, vocab, work = sys.argv[1:4]
texts = sys.argv[4:]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
failures = []


def run(*args):
    out = subprocess.run([strata, *args], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stdout + out.stderr)
        sys.exit(f"strata {args[0]} failed with exit status {out.returncode}")
    return out.stdout


def check(ok, what):
    print(("ok:     " if ok else "FAILED: ") + what)
    if not ok:
        failures.append(what)


print(f"transformers {transformers.__version__}, torch {torch.__version__}")
data = os.path.join(work, "tokens.h5")
run("prepare", "text", "--tokenizer", "gpt2", "--vocab", vocab, "--input", *texts, "--out", data,
    "--val_fraction", "0.3")  # a validation split of a context or more from a few pages
cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                   "gpt2_fortunes.toml")
if not os.path.exists(cfg):  # installed: share/strata/configs beside bin/
    cfg = os.path.join(os.path.dirname(os.path.realpath(strata)), "..", "share", "strata",
                       "configs", "gpt2_fortunes.toml")
model_dir = os.path.join(work, "run")
run("train", "--config", cfg, "--data.path", data, "--model.layers", "2", "--model.heads", "2",
    "--model.dim", "64", "--model.context", "32", "--train.max_steps", "20", "--device", "cpu",
    "--output.dir", model_dir, "--progress", "off")
h5 = os.path.join(model_dir, "model.h5")
logits_file = os.path.join(work, "logits.h5")
run("eval", "--checkpoint", h5, "--data", data, "--device", "cpu", "--logits", logits_file)
hf = os.path.join(work, "hf")
run("export", "--checkpoint", h5, "--format", "hf", "--out", hf)

# The tokenizer: each document's ids are its train split then its validation split, with
# <|endoftext|> (50256) before every document but the first.
tok = AutoTokenizer.from_pretrained(hf)
with h5py.File(data, "r") as f:
    train = f["train/tokens"][()].astype(np.int64)
    val = f["val/tokens"][()].astype(np.int64)
eot = tok.eos_token_id
check(eot == 50256, f"{type(tok).__name__}: <|endoftext|> is id {eot}")
tsplit = np.split(train, np.flatnonzero(train == 50256))
vsplit = np.split(val, np.flatnonzero(val == 50256))
for i, path in enumerate(texts):
    with open(path, "rb") as f:
        raw = f.read()
    t, v = tsplit[i], vsplit[i]
    if i:  # drop the <|endoftext|> that starts every document but the first
        t, v = t[1:], v[1:]
    strata_ids = np.concatenate([t, v]).tolist()
    hf_ids = tok.encode(raw.decode("utf-8"))
    same = hf_ids == strata_ids
    first = next((k for k, (a, b) in enumerate(zip(hf_ids, strata_ids)) if a != b),
                 min(len(hf_ids), len(strata_ids)))
    check(same, f"{os.path.basename(path)}: {len(strata_ids)} ids, transformers' encode "
          + ("identical" if same else f"differs from id {first}"))
    back = tok.decode(hf_ids, clean_up_tokenization_spaces=False).encode("utf-8")
    check(back == raw, f"{os.path.basename(path)}: transformers' decode gives the file's bytes")

# The weights.
model, info = GPT2LMHeadModel.from_pretrained(hf, output_loading_info=True)
model.eval()
missing = [k for k in info["missing_keys"] if not k.endswith((".attn.bias", ".attn.masked_bias"))]
check(not missing and not info["unexpected_keys"] and not info["mismatched_keys"],
      f"GPT2LMHeadModel.from_pretrained: missing {missing}, unexpected "
      f"{info['unexpected_keys']}, mismatched {info['mismatched_keys']}")
with h5py.File(logits_file, "r") as f:
    idx = torch.from_numpy(f["inputs"][()].astype(np.int64))
    want = f["logits"][()]
with torch.no_grad():
    got = model(idx).logits.numpy()
want = want.reshape(got.shape) if want.size == got.size else want
err = float(np.abs(got - want).max() / np.abs(want).max()) if got.shape == want.shape else float("inf")
check(err <= 1e-5, f"logits of {tuple(idx.shape)} tokens, transformers vs strata eval: "
      f"{err:.2e} relative to max|logit| (limit 1e-5)")
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
