#!/usr/bin/python3
"""strata export (Hugging Face safetensors, llm.c) and train.init_from, against the formats'
specifications and a PyTorch GPT-2 written here (docs/checkpoints.md, "Export and import").

A 2-block GPT (dim 32, 2 heads, context 16, vocabulary 300 over byte tokens: llm.c pads it to
384) trained 30 steps on Debian's fortunes (so the weights are not the initialisation), once
with the erf GELU (model.gelu's default) and once with GPT-2's tanh GELU, then:
  - export --format hf (fp32, bf16, and sharded with --max_shard_size) and --format llmc (fp32,
    bf16); every safetensors file passes every rule of the format, checked by the parser below
    (written from the specification, github.com/huggingface/safetensors "Format"): u64
    little-endian header length inside the file, a UTF-8 JSON object starting with '{', no
    duplicate keys, known dtypes, shapes of non-negative integers, data_offsets covering the
    byte buffer in order without gaps or overlaps up to the end of the file, __metadata__ of
    strings ({"format": "pt"}); and strata's own rules: header padded with spaces to 8 bytes,
    tensors listed in offset order;
  - a PyTorch GPT-2 built from config.json with Hugging Face's module names and Conv1D
    weights (in x out, x @ W + b) loads model.safetensors with load_state_dict(strict=True) as
    it is (the file holds the Conv1D layout: the only transpose against strata's out x in), and
    its logits on the first test batch match `strata eval --logits` within 1e-5 x max|logit|,
    for both GELUs (config.json's activation_function "gelu" and "gelu_new", which the PyTorch
    model runs; the other GELU misses by far more);
  - an llm.c export of the erf model warns (llm.c runs the tanh GELU), of the tanh one not;
  - the llm.c file: 256 int32 header (magic 20240326, version 3 / 5, maxT, V, L, NH, C, Vp a
    multiple of 128), size 1024 + the 16 tensors of llm.c's layout, padded rows zero, values
    those of model.safetensors (transposed back);
  - bf16 exports hold the fp32 values rounded to nearest even (numpy, bit for bit);
  - export -> train.init_from (one step at lr 1e-30: no weight changes) -> export is byte
    identical, for hf (from the single file, from the shards, and from a file as transformers
    names it: "transformer." prefixes, lm_head.weight, a mask buffer, keys in name order; and
    the tanh model's) and llmc (the tanh model's: llm.c files import as tanh only);
  - train.init_from on 2 pipeline stages x 2 replicas, and on 2 tensor parts x 2 replicas with
    ZeRO-1 (4 ranks each), gives the one-rank first-step loss within 1e-6 relative (fp32
    rounding of the grid's sums), far below the loss from the initialisation.

Usage: export_import.py STRATA FORTUNES.h5 WORKDIR
"""
import hashlib
import json
import os
import shutil
import struct
import sys

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from common import Checks, fresh_dir, run_checked, strata_cmd  # noqa: E402

strata, data, work = sys.argv[1:4]
work = fresh_dir(work, "export-import")
# The fortunes' byte tokens with a vocabulary of 300 (ids 256..299 never occur): a vocabulary
# llm.c's export pads to a multiple of 128.
tokens = os.path.join(work, "tokens300.h5")
with h5py.File(data, "r") as src, h5py.File(tokens, "w") as dst:
    dst["train/tokens"] = src["train/tokens"][:200000].astype(np.uint16)
    dst["val/tokens"] = src["val/tokens"][:20000].astype(np.uint16)
    dst.attrs.update({"kind": "tokens", "vocab": 300, "tokenizer": "bytes"})
data = tokens
MODEL = ["--data.path", data, "--model.type", "gpt", "--model.layers", "2", "--model.heads", "2",
         "--model.dim", "32", "--model.context", "16", "--model.vocab", "300",
         "--train.batch_size", "8", "--train.seed", "3", "--train.log_every", "1", "--quiet"]
check = Checks()


def run(args, ranks=1):
    return run_checked(strata_cmd(strata, ranks) + args, timeout=300)


def first_loss(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(l) for l in f if '"loss"' in l and '"event"' not in l][0]["loss"]


# ---------------------------------------------------------------- safetensors, by the spec
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys {keys}"
    return dict(pairs)


def read_safetensors(path):
    """Every rule of the format checked; returns ({name: (dtype, shape, bytes)}, metadata)."""
    with open(path, "rb") as f:
        blob = f.read()
    where = os.path.basename(path)
    check(len(blob) >= 8, f"{where}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    check(n <= 100_000_000 and 8 + n <= len(blob), f"{where}: header length {n} past the file end")
    header = blob[8:8 + n]
    check(header[:1] == b"{", f"{where}: header does not start with '{{'")
    text = header.decode("utf-8")  # raises on invalid UTF-8
    check((8 + n) % 8 == 0, f"{where}: byte buffer starts at {8 + n}, not 8-byte aligned")
    check(len(text) - len(text.rstrip(" ")) < 8 and text.rstrip(" ").endswith("}"),
          f"{where}: header padding is not spaces (at most 7)")
    obj = json.loads(text, object_pairs_hook=no_duplicates)
    meta = obj.pop("__metadata__", None)
    check(isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()),
          f"{where}: __metadata__ is not a string map")
    check(meta == {"format": "pt"}, f"{where}: __metadata__ {meta}")
    buf = blob[8 + n:]
    entries = []
    for name, e in obj.items():
        check(set(e) == {"dtype", "shape", "data_offsets"}, f"{where}: {name} has keys {sorted(e)}")
        check(e["dtype"] in DTYPE_BYTES, f"{where}: {name} dtype {e['dtype']}")
        check(all(isinstance(d, int) and d >= 0 for d in e["shape"]), f"{where}: {name} shape {e['shape']}")
        b, end = e["data_offsets"]
        check(isinstance(b, int) and isinstance(end, int) and 0 <= b <= end, f"{where}: {name} offsets")
        check(end - b == int(np.prod(e["shape"], dtype=np.int64)) * DTYPE_BYTES[e["dtype"]],
              f"{where}: {name} offsets hold {end - b} bytes for {e['dtype']} {e['shape']}")
        entries.append((b, end, name, e))
    check([x[2] for x in sorted(entries)] == [x[2] for x in entries], f"{where}: header not in offset order")
    at = 0
    for b, end, name, _ in sorted(entries):
        check(b == at, f"{where}: {name} starts at {b}, the previous tensor ends at {at}")
        at = end
    check(at == len(buf), f"{where}: tensors cover {at} of the buffer's {len(buf)} bytes")
    return {name: (e["dtype"], tuple(e["shape"]), buf[b:end]) for b, end, name, e in entries}, meta


def as_f32(dtype, shape, raw):
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").reshape(shape)
    check(dtype == "BF16", f"dtype {dtype}")
    return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)


def bf16_rne(x):
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


# ---------------------------------------------------------------- a PyTorch GPT-2, HF's names
class Conv1D(nn.Module):
    """transformers' Conv1D: weight (in, out), y = x @ W + b."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.empty(nf))

    def forward(self, x):
        return x @ self.weight + self.bias


def hf_gpt2(cfg):
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    act = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh")}[cfg["activation_function"]]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = Conv1D(C, 3 * C), Conv1D(C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            att = (q @ k.transpose(-2, -1)) / (C // H) ** 0.5
            att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
            return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.c_proj = Conv1D(C, 4 * C), Conv1D(4 * C, C)

        def forward(self, x):
            return self.c_proj(act(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(C, eps=eps), Attention()
            self.ln_2, self.mlp = nn.LayerNorm(C, eps=eps), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg["vocab_size"], C)
            self.wpe = nn.Embedding(cfg["n_positions"], C)
            self.h = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
            self.ln_f = nn.LayerNorm(C, eps=eps)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.h:
                x = b(x)
            return self.ln_f(x) @ self.wte.weight.T  # tied LM head

    return GPT2()


# ---------------------------------------------------------------- train, export
run(["train"] + MODEL + ["--train.max_steps", "30", "--train.optimizer", "adamw", "--train.lr", "0.01",
                         "--output.dir", os.path.join(work, "trained")])
model_h5 = os.path.join(work, "trained", "model.h5")
hf, hf16, hfs = (os.path.join(work, d) for d in ("hf", "hf-bf16", "hf-sharded"))
llmc, llmc16 = os.path.join(work, "model.bin"), os.path.join(work, "model-bf16.bin")
run(["export", "--checkpoint", model_h5, "--format", "hf", "--out", hf])
run(["export", "--checkpoint", model_h5, "--format", "hf", "--out", hf16, "--dtype", "bf16"])
run(["export", "--checkpoint", model_h5, "--format", "hf", "--out", hfs, "--max_shard_size", "20KB"])
warned = run(["export", "--checkpoint", model_h5, "--format", "llmc", "--out", llmc]).stderr
run(["export", "--checkpoint", model_h5, "--format", "llmc", "--out", llmc16, "--dtype", "bf16"])
check("strata: warning:" in warned and "erf GELU" in warned, f"llm.c export of an erf model: stderr {warned!r}")
# The same run with GPT-2's tanh GELU.
run(["train"] + MODEL + ["--model.gelu", "tanh", "--train.max_steps", "30", "--train.optimizer", "adamw",
                         "--train.lr", "0.01", "--output.dir", os.path.join(work, "trained-tanh")])
model_tanh_h5 = os.path.join(work, "trained-tanh", "model.h5")
hf_tanh, llmc_tanh = os.path.join(work, "hf-tanh"), os.path.join(work, "model-tanh.bin")
run(["export", "--checkpoint", model_tanh_h5, "--format", "hf", "--out", hf_tanh])
quiet = run(["export", "--checkpoint", model_tanh_h5, "--format", "llmc", "--out", llmc_tanh]).stderr
check(quiet == "", f"llm.c export of a tanh model: stderr {quiet!r}")

with h5py.File(model_h5, "r") as f:
    strata_w = {k: f["params"][k][()] for k in ("embedding1/wte", "block1/attn/c_attn/weight")}
tensors, _ = read_safetensors(os.path.join(hf, "model.safetensors"))
with open(os.path.join(hf, "config.json")) as f:
    cfg = json.load(f)
print(f"hf: {len(tensors)} tensors, config {cfg['n_layer']} layers, {cfg['n_head']} heads, "
      f"vocab {cfg['vocab_size']}, activation {cfg['activation_function']}")
check(cfg["architectures"] == ["GPT2LMHeadModel"] and cfg["model_type"] == "gpt2" and cfg["tie_word_embeddings"],
      f"config.json {cfg}")
check((cfg["n_layer"], cfg["n_head"], cfg["n_embd"], cfg["n_positions"], cfg["vocab_size"]) == (2, 2, 32, 16, 300),
      "config.json sizes")
check(not os.path.exists(os.path.join(hf, "vocab.json")), "tokenizer files for a byte-level model")
fp32 = {k: as_f32(*v) for k, v in tensors.items()}
check(np.array_equal(fp32["h.0.attn.c_attn.weight"], strata_w["block1/attn/c_attn/weight"].T),
      "c_attn.weight is not strata's weight transposed (Conv1D: in x out)")
check(np.array_equal(fp32["wte.weight"], strata_w["embedding1/wte"]), "wte differs from strata's")

# Sharded: the index and the parts hold the single file's tensors, byte for byte.
with open(os.path.join(hfs, "model.safetensors.index.json")) as f:
    index = json.load(f)
parts = sorted(set(index["weight_map"].values()))
check(len(parts) > 1 and parts[0] == f"model-00001-of-{len(parts):05d}.safetensors", f"shards {parts}")
sharded = {}
for p in parts:
    t, _ = read_safetensors(os.path.join(hfs, p))
    check(all(index["weight_map"][k] == p for k in t), f"{p}: weight_map disagrees")
    sharded.update(t)
check(sharded == tensors, "the shards' tensors differ from model.safetensors")
check(index["metadata"]["total_size"] == sum(len(v[2]) for v in tensors.values()), "index total_size")
print(f"sharded: {len(parts)} files at --max_shard_size 20KB, {len(sharded)} tensors, same bytes")
# Exported again into the same directory as one file: no index or shard of the last export left.
hfs1 = os.path.join(work, "hf-resharded")
shutil.copytree(hfs, hfs1)
run(["export", "--checkpoint", model_h5, "--format", "hf", "--out", hfs1])
check(sorted(os.listdir(hfs1)) == ["config.json", "model.safetensors"], f"left in the directory: {os.listdir(hfs1)}")

# bf16: the fp32 values rounded to nearest even.
t16, _ = read_safetensors(os.path.join(hf16, "model.safetensors"))
worst = 0
for k, (dt, shape, raw) in t16.items():
    check(dt == "BF16", f"bf16 export: {k} is {dt}")
    same = np.array_equal(np.frombuffer(raw, "<u2").reshape(shape), bf16_rne(fp32[k]))
    check(same, f"bf16 export: {k} is not fp32 rounded to nearest even")
    worst = max(worst, float(np.max(np.abs(as_f32(dt, shape, raw) - fp32[k]) / np.maximum(np.abs(fp32[k]), 1e-30))))
print(f"bf16: {len(t16)} tensors equal to round-to-nearest-even of fp32 (max relative change {worst:.2e})")

# A model file recording GPT-2's tokenizer (the tokenizer's attributes, with stand-in vocabulary
# files) and a real vocabulary (vocab_size) smaller than its token table: the files are copied
# byte for byte, the table's extra rows left out (hf) or zeroed (llm.c).
tok_model, vocab_dir = os.path.join(work, "tok-model.h5"), os.path.join(work, "vocab")
shutil.copy(model_h5, tok_model)
os.makedirs(vocab_dir)
vocab_files = {"encoder.json": b'{"!": 0, "\\u0120t": 1}\n', "vocab.bpe": b"#version: 0.2\n\xc4\xa0 t\n"}
for name, content in vocab_files.items():
    with open(os.path.join(vocab_dir, name), "wb") as f:
        f.write(content)
with h5py.File(tok_model, "r+") as f:
    f.attrs.update({"tokenizer": "gpt2", "tokenizer_vocab": vocab_dir, "vocab_size": np.int64(290)})
    for name, content in vocab_files.items():
        f.attrs["tokenizer_sha256_" + name] = hashlib.sha256(content).hexdigest()
hft, llmct = os.path.join(work, "hf-tok"), os.path.join(work, "tok.bin")
run(["export", "--checkpoint", tok_model, "--format", "hf", "--out", hft])
run(["export", "--checkpoint", tok_model, "--format", "llmc", "--out", llmct])
copied = {n: open(os.path.join(hft, n), "rb").read() for n in ("vocab.json", "merges.txt")}
check(copied == {"vocab.json": vocab_files["encoder.json"], "merges.txt": vocab_files["vocab.bpe"]},
      "tokenizer files are not encoder.json and vocab.bpe byte for byte")
with open(os.path.join(hft, "tokenizer_config.json")) as f:
    tcfg = json.load(f)
with open(os.path.join(hft, "special_tokens_map.json")) as f:
    smap = json.load(f)
with open(os.path.join(hft, "config.json")) as f:
    tok_cfg = json.load(f)
check(tcfg["tokenizer_class"] == "GPT2Tokenizer" and tcfg["model_max_length"] == 16 and
      smap["eos_token"] == "<|endoftext|>", f"tokenizer_config {tcfg}, special tokens {smap}")
check(tok_cfg["vocab_size"] == 290 and tok_cfg["eos_token_id"] == 50256, f"config.json {tok_cfg}")
tt, _ = read_safetensors(os.path.join(hft, "model.safetensors"))
check(np.array_equal(as_f32(*tt["wte.weight"]), fp32["wte.weight"][:290]), "wte: not the first vocab_size rows")
hdr = np.frombuffer(open(llmct, "rb").read(1024), "<i4")
wte_t = np.frombuffer(open(llmct, "rb").read(), "<f4")[256:256 + 384 * 32].reshape(384, 32)
check(hdr[3] == 290 and hdr[7] == 384 and not wte_t[290:].any() and np.array_equal(wte_t[:290], fp32["wte.weight"][:290]),
      f"llm.c export of vocab_size 290: header {hdr[:8]}")
print(f"tokenizer: vocab.json, merges.txt copied byte for byte, tokenizer_config.json, special_tokens_map.json; "
      f"vocab_size 290 of 300 rows: hf wte {tt['wte.weight'][1]}, llm.c V 290 Vp 384 (rows 290.. zero)")

# ---------------------------------------------------------------- PyTorch loads it, same logits
for h5, out_dir, gelu in ((model_h5, hf, "gelu"), (model_tanh_h5, hf_tanh, "gelu_new")):
    with open(os.path.join(out_dir, "config.json")) as f:
        c = json.load(f)
    check(c["activation_function"] == gelu, f"{out_dir}/config.json: activation_function {c['activation_function']}")
    state = {k: torch.from_numpy(as_f32(*v).copy())
             for k, v in read_safetensors(os.path.join(out_dir, "model.safetensors"))[0].items()}
    logits = os.path.join(work, f"logits-{gelu}.h5")
    run(["eval", "--checkpoint", h5, "--data", data, "--batch_size", "4", "--logits", logits])
    with h5py.File(logits, "r") as f:
        idx, want = f["inputs"][()].astype(np.int64), f["logits"][()]
    errs = {}
    for act in ("gelu", "gelu_new"):  # the config's GELU, and the other one: far off
        gpt = hf_gpt2(dict(c, activation_function=act))
        gpt.load_state_dict(state, strict=True)
        with torch.no_grad():
            got = gpt(torch.from_numpy(idx)).numpy()
        errs[act] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    err, other = errs[gelu], errs["gelu" if gelu == "gelu_new" else "gelu_new"]
    print(f"logits ({gelu}): PyTorch (HF names, strict load) vs strata eval on {idx.shape[0]}x{idx.shape[1]} "
          f"tokens: max |diff| / max |logit| = {err:.2e} (with the other GELU: {other:.2e})")
    check(got.shape == want.shape and err <= 1e-5, f"{gelu}: logits differ by {err:.2e} relative")
    check(other > 10 * max(err, 1e-7), f"{gelu}: the other GELU's logits are as close ({other:.2e})")

# ---------------------------------------------------------------- llm.c
NAMES = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
         "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
         "mlp.c_proj.weight", "mlp.c_proj.bias"]
for path, version, size in ((llmc, 3, 4), (llmc16, 5, 2)):
    blob = open(path, "rb").read()
    h = np.frombuffer(blob[:1024], "<i4")
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    check(h[0] == 20240326 and h[1] == version and not h[8:].any(), f"{path}: header {h[:8]}")
    check((maxT, V, L, NH, C, Vp) == (16, 300, 2, 2, 32, 384), f"{path}: header {h[:8]}")
    sizes = [Vp * C, maxT * C] + [L * s for s in (C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C,
                                                  4 * C * C, C)] + [C, C]
    check(len(blob) == 1024 + sum(sizes) * size, f"{path}: {len(blob)} bytes, llm.c's layout needs "
          f"{1024 + sum(sizes) * size}")
    vals = (np.frombuffer(blob[1024:], "<f4") if size == 4 else
            (np.frombuffer(blob[1024:], "<u2").astype(np.uint32) << 16).view(np.float32))
    ref = fp32 if size == 4 else {k: as_f32(*v) for k, v in t16.items()}
    at, parts_ok = 0, True
    expect = [np.concatenate([ref["wte.weight"], np.zeros((Vp - V, C), np.float32)]), ref["wpe.weight"]]
    for n in NAMES:  # llm.c: nn.Linear's out x in, i.e. HF's Conv1D weights transposed
        expect.append(np.stack([ref[f"h.{l}.{n}"].T if n.endswith("weight") and "ln" not in n
                                else ref[f"h.{l}.{n}"] for l in range(L)]))
    expect += [ref["ln_f.weight"], ref["ln_f.bias"]]
    for e, s in zip(expect, sizes):
        parts_ok &= e.size == s and np.array_equal(vals[at:at + s], e.ravel())
        at += s
    check(parts_ok, f"{path}: tensors are not model.safetensors' in llm.c's order and layout")
    print(f"llmc v{version}: header maxT {maxT} V {V} L {L} NH {NH} C {C} Vp {Vp}, {len(blob)} bytes, "
          f"16 tensors in llm.c's order")

# ---------------------------------------------------------------- export -> import -> export
def reimport(src, tag, ranks=1, grid=()):
    out = os.path.join(work, tag)
    run(["train"] + MODEL + ["--train.init_from", src, "--train.max_steps", "1", "--train.lr", "1e-30",
                             "--output.dir", out] + list(grid), ranks)
    return out


# As transformers' save_pretrained might write it: names under "transformer.", the tied
# lm_head.weight and an attention-mask buffer beside them, header keys in name order (not offset
# order), no padding.
hfp = os.path.join(work, "hf-prefixed")
os.makedirs(hfp)
extra = dict({"transformer." + k: v for k, v in tensors.items()}, **{
    "lm_head.weight": tensors["wte.weight"],
    "transformer.h.0.attn.bias": ("F32", (1, 1, 16, 16), np.tril(np.ones((16, 16), np.float32)).tobytes())})
order, at, hdr = sorted(extra, key=lambda k: (len(extra[k][2]), k)), 0, {}
for k in order:
    hdr[k] = {"dtype": extra[k][0], "shape": list(extra[k][1]), "data_offsets": [at, at + len(extra[k][2])]}
    at += len(extra[k][2])
text = json.dumps(dict(sorted(hdr.items()), __metadata__={"format": "pt"})).encode()
with open(os.path.join(hfp, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(extra[k][2] for k in order))

TANH = ["--model.gelu", "tanh"]
for src, tag, ref, extra in ((hf, "from-hf", hf, []), (hfs, "from-shards", hf, []), (hfp, "from-prefixed", hf, []),
                             (hf_tanh, "from-hf-tanh", hf_tanh, TANH), (llmc_tanh, "from-llmc", llmc_tanh, TANH)):
    out = reimport(src, tag, grid=extra)
    fmt = "llmc" if tag == "from-llmc" else "hf"
    again = os.path.join(work, tag + "-export" + (".bin" if fmt == "llmc" else ""))
    run(["export", "--checkpoint", os.path.join(out, "model.h5"), "--format", fmt, "--out", again])
    if fmt == "llmc":
        same = open(again, "rb").read() == open(ref, "rb").read()
    else:
        same = all(open(os.path.join(again, f), "rb").read() == open(os.path.join(ref, f), "rb").read()
                   for f in ("model.safetensors", "config.json"))
    print(f"export -> init_from ({tag[5:]}) -> export: {'byte-identical' if same else 'DIFFERENT'}")
    check(same, f"{tag}: the re-export differs from the export")

fresh = first_loss(os.path.join(work, "trained"))  # the same first batch, from the initialisation
one = first_loss(reimport(hf, "grid-1"))
check(one < fresh - 1, f"init_from's first loss {one} is not the trained model's (fresh: {fresh})")
for tag, grid in (("2 stages x 2 replicas", ["--parallel.pipeline_stages", "2"]),
                  ("2 tensor parts x 2 replicas, ZeRO-1", ["--parallel.tensor", "2", "--parallel.zero", "1"])):
    four = first_loss(reimport(hf, "grid-" + tag.split()[0] + tag.split()[1], 4, grid))
    rel = abs(four - one) / abs(one)
    print(f"init_from first-step loss: 1 rank {one:.8f}, {tag} {four:.8f} (relative {rel:.1e}; "
          f"from the initialisation {fresh:.4f})")
    check(rel <= 1e-6, f"first-step loss on {tag} differs by {rel:.1e}")

check.finish()
