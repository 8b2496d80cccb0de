#!/usr/bin/python3
"""The bad-input corpus: what a hostile user or environment can hand strata, and what strata
must do with it (README "Exit codes"; issue 14).

Usage: bad_inputs.py CLASS --strata STRATA --work DIR [--list]
  CLASS: config | flags | data | tokens | checkpoint | params | env | sbatch | memory | all

Every case runs one command and checks:
  - its exit code;
  - for an error, exactly one line `strata: error: ...` on stderr, matching the case's pattern
    (which names the file, dataset, attribute, key, flag, variable or rank at fault);
    for a case that must work, no error line;
  - no crash text anywhere in its output (CRASH_TEXT below);
  - no file that existed before was changed: the case's output directory holds a model.h5,
    metrics.jsonl and a checkpoint directory beforehand, and every input file is hashed too;
    no temporary file is left behind;
  - it ends within 60 s;
  - where a case says so, a marker file was never created (no shell ran).
Prints a line per case and a summary; exits 1 if any case fails.
"""
import argparse
import atexit
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zlib
from typing import Callable, Optional

import h5py
import numpy as np

CRASH_TEXT = re.compile(r"terminate called|bad_alloc|what\(\):|Aborted|Segmentation fault|"
                        r"core dumped|MPI_ABORT|internal error|HDF5-DIAG|Traceback|backtrace|"
                        r"stack trace|AddressSanitizer|runtime error:")
MARKER = "/tmp/strata-badinput-marker"
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
for v in ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK", "STRATA_JOB_END_TIME", "SLURM_RESTART_COUNT",
          "SLURM_LOCALID", "STRATA_DATA_CACHE_MB", "STRATA_TEST_HANG", "SLURM_ARRAY_JOB_ID",
          "SLURM_ARRAY_TASK_ID", "STRATA_ATTEMPT_START", "STRATA_STEP_START", "STRATA_MAX_NO_PROGRESS",
          "STRATA_MAX_RESTARTS", "STRATA_MIN_NODES", "STRATA_HEALTH_TIMEOUT", "STRATA_STEP_NODES"):
    ENV.pop(v, None)
ERROR = "strata: error: "
EXPORT_LOCK = threading.Lock()  # the params cases' one export of the GPT fixture


# A checkpoint whose damaged global heap sends HDF5 1.10's H5Aread into an endless loop.
HEAP_LOOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "hangs", "checkpoint",
                         "hdf5-global-heap-loop.h5")
# A data file on which HDF5 corrupts the heap (glibc aborts).
DATA_ABORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "crashes", "dataset",
                          "hdf5-heap-corruption-abort.h5")
# One whose damaged global heap makes HDF5 1.10's H5Aread memcpy a garbage length (a segfault).
H100 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "clusters",
                    "h100-nvlink4-ndr400.toml")
SBATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm", "train.sbatch")
HEAP_CRASH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "crashes", "checkpoint",
                          "hdf5-global-heap-memcpy.h5")


@dataclasses.dataclass
class Case:
    name: str
    argv: list                      # {S} strata, {OUT} output dir, {W} work dir, {D} tiny data ...
    code: int
    pattern: str = ""               # the error line must match (re.search); "" for code 0
    env: dict = dataclasses.field(default_factory=dict)
    make: Optional[Callable] = None  # make(case_dir) writes the case's inputs
    check_stdout: Optional[Callable] = None  # extra check of stdout for cases that must work
    allow_changes: str = ""         # why files in the output dir may change (e.g. *.corrupt)
    error_line_prefix: str = ERROR  # the sbatch script's own errors say "train.sbatch: error: "
    preexec: Optional[Callable] = None  # runs in the child before strata (a cgroup to join)
    # The output directory also holds an earlier run's checkpoints (a run given --resume, or one
    # that must fail): a new run refuses them first, which hides a later error it is about.
    earlier_checkpoints: bool = True


# ----------------------------------------------------------------------------- fixtures

class Fixtures:
    """Small valid inputs written once per work dir: a tiny image dataset, a token file, and the
    outputs of short strata runs (parameter files and checkpoints of an MLP and a GPT)."""

    def __init__(self, strata, work):
        self.strata, self.work = strata, work
        self.base = os.path.join(work, "fixtures")
        self.tiny = self.path("tiny.h5")
        self.tokens = self.path("tokens.h5")
        # Remade when the strata binary changed: fixtures of an older build may lack what the
        # cases expect (a model file's newer attributes, say).
        st = os.stat(strata)
        made_by = f"{os.path.realpath(strata)} {st.st_size} {st.st_mtime_ns}\n"
        done = self.path("done")
        if not os.path.exists(done) or open(done).read() != made_by:
            shutil.rmtree(self.base, ignore_errors=True)
            os.makedirs(self.base)
            self._make()
            with open(done, "w") as f:
                f.write(made_by)

    def path(self, *p):
        return os.path.join(self.base, *p)

    def _run(self, args):
        p = subprocess.run([self.strata] + args, env=ENV, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            sys.exit(f"fixture run failed: {args}\n{p.stderr}")

    def _make(self):
        rng = np.random.default_rng(0)
        with h5py.File(self.tiny, "w") as f:
            f["train/images"] = rng.integers(0, 255, (64, 8, 8)).astype(np.uint8)
            f["train/labels"] = rng.integers(0, 4, 64).astype(np.uint8)
            f["test/images"] = rng.integers(0, 255, (16, 8, 8)).astype(np.uint8)
            f["test/labels"] = rng.integers(0, 4, 16).astype(np.uint8)
            f.attrs["classes"] = 4
        text = self.path("text.txt")
        with open(text, "w") as f:
            words = ["alpha", "beta", "gamma", "delta", "pipeline", "stage", "rank", "loss"]
            f.write(" ".join(words[i % 8] for i in range(4000)) + "\n")
        self._run(["prepare", "text", "--input", text, "--out", self.tokens])
        self._run(["train"] + self.mlp_args() + ["--train.max_steps", "2", "--checkpoint.every_steps", "1",
                   "--output.dir", self.path("mlp"), "--quiet"])
        self._run(["train"] + self.gpt_args() + ["--train.max_steps", "2", "--checkpoint.every_steps", "1",
                   "--output.dir", self.path("gpt"), "--quiet"])
        # A checkpoint of 52 MiB of parameters and as much of each optimizer state: its read
        # needs more than its model's buffers (the memory class's resume case).
        self._run(["train", "--data.path", self.tiny, "--train.batch_size", "8", "--model.hidden", "3600", "3600",
                   "--train.max_steps", "1", "--checkpoint.every_steps", "1", "--output.dir", self.path("big"),
                   "--quiet"])
        os.rename(self.path("big", "checkpoints", "ckpt-000000001.h5"), self.path("big", "ckpt.h5"))
        shutil.rmtree(self.path("big", "checkpoints"))

    def mlp_args(self):
        return ["--data.path", self.tiny, "--model.hidden", "8", "--train.batch_size", "8"]

    def gpt_args(self):
        return ["--data.path", self.tokens, "--model.type", "gpt", "--model.layers", "1", "--model.heads", "1",
                "--model.dim", "8", "--model.context", "8", "--train.batch_size", "2"]

    @property
    def mlp_params(self):
        return self.path("mlp", "model.h5")

    @property
    def mlp_ckpt(self):
        return self.path("mlp", "checkpoints", "ckpt-000000002.h5")

    @property
    def gpt_params(self):
        return self.path("gpt", "model.h5")


# ----------------------------------------------------------------------------- helpers

def without_format(src, dst):
    """A copy of checkpoint `src` whose root attribute 'format' is gone: damaged metadata."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        del f.attrs["format"]


def crc(a):
    return np.int64(zlib.crc32(np.ascontiguousarray(a, dtype="<f4").tobytes()))


def replace_tensor(f, name, value):
    """Replaces dataset `name` by `value` (float32) with a valid CRC, as strata would write it."""
    del f[name]
    d = f.create_dataset(name, data=np.asarray(value, dtype=np.float32))
    d.attrs["crc32"] = crc(d[()])


def mutated(src, fn):
    """make(): copies a file strata wrote to CASE/in.h5 and applies fn(h5py.File) to the copy."""
    def make(case_dir):
        dst = os.path.join(case_dir, "in.h5")
        shutil.copy(src, dst)
        with h5py.File(dst, "r+") as f:
            fn(f)
    return make


def file_with(text, name="c.toml", binary=False):
    def make(case_dir):
        with open(os.path.join(case_dir, name), "wb" if binary else "w") as f:
            f.write(text)
    return make


def dataset(images=None, labels=None, test=None, attrs=None, name="in.h5"):
    """make(): an image dataset (h5py) with the given arrays; None leaves a dataset out."""
    def make(case_dir):
        with h5py.File(os.path.join(case_dir, name), "w") as f:
            if images is not None:
                f["train/images"] = images
            if labels is not None:
                f["train/labels"] = labels
            for k, v in (test or {}).items():
                f[k] = v
            for k, v in (attrs or {}).items():
                f.attrs[k] = v
    return make


def gpt2_vocab(text="", merges=("l l",), extra_json=None):
    """make(): a GPT-2 vocabulary in the case dir: encoder.json (the 256 bytes in GPT-2's
    spelling, ids 0..255, then "ll" = 256 and extra_json) and vocab.bpe (merges). text: the
    encoder.json text instead; None: no encoder.json."""
    def spell(b):  # GPT-2's bytes_to_unicode
        printable = [c for c in range(256) if 33 <= c <= 126 or 161 <= c <= 172 or c >= 174]
        return chr(b) if b in printable else chr(256 + [c for c in range(256) if c not in printable].index(b))

    def make(case_dir):
        vocab = {spell(b): b for b in range(256)}
        vocab.update({"ll": 256, **(extra_json or {})})
        if text is not None:
            with open(os.path.join(case_dir, "encoder.json"), "w", encoding="utf-8") as f:
                f.write(text or json.dumps(vocab))
        with open(os.path.join(case_dir, "vocab.bpe"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    return make


# ----------------------------------------------------------------------------- the corpus

def cases(fx: Fixtures):
    S, D = fx.strata, fx.tiny
    train = [S, "train"] + fx.mlp_args() + ["--train.max_steps", "1", "--output.dir", "{OUT}", "--quiet"]
    gtrain = [S, "train"] + fx.gpt_args() + ["--train.max_steps", "1", "--output.dir", "{OUT}", "--quiet"]
    cfg = train + ["--config", "{C}/c.toml"]
    rng = np.random.default_rng(1)
    img = rng.integers(0, 255, (16, 8, 8)).astype(np.uint8)
    lab = rng.integers(0, 4, 16).astype(np.uint8)
    out = {k: [] for k in ("config", "flags", "data", "tokens", "checkpoint", "params", "env", "sbatch",
                           "memory")}

    # ---- config files: types, ranges, structure, syntax (TOML 1.0, strict) ----
    def conf(name, text, pattern, code=2):
        out["config"].append(Case(f"config: {name}", cfg, code, pattern, make=file_with(text)))
    conf("model.activation = \"silu\" trains (must work)", '[model]\nactivation = "silu"\n', "", code=0)
    key_re = r"config .*c\.toml:\d+:\d+: key "
    for key, value, why in [
            ("train.lr", "nan", "finite"), ("train.lr", "inf", "finite"), ("train.lr", "-inf", "finite"),
            ("train.lr", "1e39", "32-bit float"), ("train.lr", "-0.1", r"must be > 0"),
            ("train.lr", "0", r"must be > 0"), ("train.momentum", "nan", "finite"),
            ("train.momentum", "1.5", r"must be in \[0, 0.9999\]"), ("train.grad_clip", "nan", "finite"),
            ("train.grad_clip", "-1", ">= 0"), ("train.weight_decay", "inf", "finite"),
            ("train.eps", "1e-50", "32-bit float"), ("train.beta2", "1.0", "must be in"),
            ("model.dropout", "nan", "finite"), ("model.dropout", "1.0", "must be in"),
            ("dp.bucket_mb", "nan", "finite"), ("dp.bucket_mb", "0", "must be in"),
            ("watchdog.timeout_s", "nan", "finite"), ("watchdog.timeout_s", "-5", "must be in"),
            ("checkpoint.every_seconds", "inf", "finite"), ("train.batch_size", "0", ">= 1"),
            ("train.batch_size", "-64", ">= 1"), ("train.epochs", "0", ">= 1"),
            ("train.seed", "-1", ">= 0"), ("model.kernel", "16", r"in \[1, 15\]"),
            ("model.heads", "3000000000", "must be in"), ("model.dim", "20000000", r"must be in \[1, 16777216\]"), ("parallel.pipeline_stages", "0", "must be in"),
            ("parallel.microbatches", "5000", "must be in"), ("model.hidden", "[256, 0]", "element 2"),
            ("checkpoint.keep_last", "0", ">= 1"), ("train.warmup_steps", "-1", ">= 0")]:
        sec, k = key.split(".")
        conf(f"{key} = {value}", f"[{sec}]\n{k} = {value}\n", key_re + re.escape(key) + ": .*" + why)
    conf("integer overflows int64", "[train]\nbatch_size = 99999999999999999999\n", r"c\.toml:2:\d+: not valid TOML")
    conf("float overflows double", "[train]\nlr = 1e400\n", r"c\.toml:2:\d+: (not valid TOML|key train\.lr)")
    for key, value, got in [("train.batch_size", '"32"', "a string"), ("train.batch_size", "[32]", "an array"),
                            ("train.epochs", "3.0", "a float"), ("train.nesterov", '"yes"', "a string"),
                            ("train.nesterov", "1", "an integer"), ("train.lr", '"0.1"', "a string"),
                            ("model.type", "3", "an integer"), ("model.hidden", "256", "an integer"),
                            ("model.hidden", '["256"]', "an array holding a string"),
                            ("train.lr", "{ x = 1 }", "a table"), ("data.path", "1979-05-27", "a date"),
                            ("model.layers", "[1, 2]", "an array holding an integer"),
                            ("train.optimizer", '"adam"', "expected one of sgd, adamw")]:
        sec, k = key.split(".")
        conf(f"{key} = {value}", f"[{sec}]\n{k} = {value}\n", key_re + re.escape(key) + ": .*" + re.escape(got))
    conf("duplicate key", "[train]\nepochs = 1\nepochs = 2\n", r"c\.toml:3:\d+: not valid TOML")
    conf("duplicate section", "[train]\nepochs = 1\n[train]\nlr = 0.1\n", r"c\.toml:3:\d+: not valid TOML")
    conf("unknown key", "[train]\nepoch = 3\n", r"c\.toml:2:1: unknown key 'train\.epoch' \(did you mean 'train\.epochs'\?\)")
    conf("unknown section", "[trian]\nepochs = 3\n", r"c\.toml:1:2: unknown section \[trian\]")
    conf("empty unknown section", "[extra]\n", r"unknown section \[extra\]")
    conf("key outside a section", "epochs = 3\n", r"c\.toml:1:1: unknown key 'epochs' \(keys belong in a \[section\]")
    conf("nested table in a section", "[train.opt]\nx = 1\n", r"unknown key 'train\.opt'")
    conf("table nested 500 deep", "[train" + ".x" * 500 + "]\ny = 1\n", r"c\.toml:\d+:\d+: (unknown key 'train\.x'|not valid TOML)")
    conf("array nested 600 deep", "[train]\nlr = " + "[" * 600 + "\n", r"not valid TOML")
    conf("dotted key into a number", "[train]\nlr.x = 1\n", r"key train\.lr: expected a number")
    conf("array of tables", "[[train]]\nepochs = 1\n", r"unknown key 'train'")
    conf("unterminated string", '[data]\npath = "data.h5\n', r"c\.toml:2:\d+: not valid TOML")
    conf("bad escape", '[data]\npath = "a\\qb"\n', r"c\.toml:2:\d+: not valid TOML")
    conf("control character in a string", '[data]\npath = "a\\u0001b"\n', r"key data\.path: contains a control character")
    conf("missing value", "[train]\nepochs =\n", r"c\.toml:2:\d+: not valid TOML")
    conf("missing bracket", "[train\nepochs = 1\n", r"c\.toml:1:\d+: not valid TOML")
    conf("non-ASCII outside strings (toml++ 3.3 unreachable)", "[train]\nepochs = 3\u048f\n",
         r"c\.toml:2:\d+: a non-ASCII character outside a string or comment")
    conf("non-ASCII in a multi-line string", '[data]\npath = """\\\n\u048f"""\n', r"multi-line string")
    out["config"].append(Case("config: invalid UTF-8", cfg, 2, r"c\.toml:\d+:\d+: not valid TOML",
                              make=file_with(b"[data]\npath = \"\xff\xfe\"\n", binary=True)))
    out["config"].append(Case("config: binary garbage", cfg, 2, r"c\.toml:\d+:\d+: ",
                              make=file_with(bytes(range(256)) * 4, binary=True)))
    out["config"].append(Case("config: larger than 1 MiB", cfg, 2, r"c\.toml: \d+ bytes is too large",
                              make=file_with("# x\n" * 300000)))
    out["config"].append(Case("config: a directory", train + ["--config", "{C}"], 2, r"config .*: not a regular file"))
    out["config"].append(Case("config: /dev/zero", train + ["--config", "/dev/zero"], 2, r"config /dev/zero: not a regular file"))
    out["config"].append(Case("config: missing file", train + ["--config", "{C}/none.toml"], 2, r"config .*none\.toml: cannot open \(No such file"))
    conf("min_lr above lr", "[train]\nlr = 0.01\nmin_lr = 0.1\n", r"train\.min_lr: 0\.1 is larger than train\.lr")
    conf("heartbeat timeout below 0.5 s", "[watchdog]\nheartbeat_timeout_s = 0.2\n",
         r"watchdog\.heartbeat_timeout_s = 0\.2: below 0\.5 s live ranks would be named")
    conf("even cnn kernel", '[model]\ntype = "cnn"\nkernel = 4\n', r"model\.kernel: 4 is even")
    conf("custom model without layers", '[model]\ntype = "custom"\n', r"model\.layers: model\.type = \"custom\" needs")
    conf("custom layer unknown", '[model]\ntype = "custom"\nlayers = ["flatten", "dense 4"]\n', r"model\.layers: 'dense 4': unknown layer 'dense'")
    conf("custom layer with newline", '[model]\ntype = "custom"\nlayers = ["flatten\\nlinear 4"]\n', r"key model\.layers: contains a control character")
    # The effective config strata stores in its files runs again as it is (item 12).
    def effective(src):
        def make(case_dir):
            with h5py.File(src) as f:
                text = f.attrs["config"]
            with open(os.path.join(case_dir, "c.toml"), "w") as f:
                f.write(text.decode() if isinstance(text, bytes) else text)
        return make
    for name, src, base in (("mlp model.h5", fx.mlp_params, train), ("mlp checkpoint", fx.mlp_ckpt, train),
                            ("gpt model.h5", fx.gpt_params, gtrain)):
        out["config"].append(Case(f"config: the effective config of a {name} runs again",
                                  [S, "train", "--config", "{C}/c.toml", "--train.max_steps", "1",
                                   "--output.dir", "{OUT}", "--quiet"], 0, make=effective(src)))

    # ---- flags: the same rules on the command line, and the run-level flags ----
    def flag(name, args, pattern, base=None):
        out["flags"].append(Case(f"flags: {name}", (base or train) + args, 2, pattern))
    for f_, v, why in [("--train.lr", "nan", "finite"), ("--train.lr", "inf", "finite"), ("--train.lr", "-inf", "finite"),
                       ("--train.lr", "1e39", "32-bit float"), ("--train.lr", "1e400", "out of range"),
                       ("--train.lr", "abc", "expected a number, got 'abc'"), ("--train.lr", "", "expected a number"),
                       ("--train.lr", "0.1x", "expected a number"), ("--train.lr", "0", "must be > 0"),
                       ("--train.batch_size", "0", ">= 1"), ("--train.batch_size", "1e3", "expected an integer, got '1e3'"),
                       ("--train.batch_size", "0x10", "expected an integer, got '0x10'"),
                       ("--train.batch_size", "99999999999999999999", "out of range for a 64-bit integer"),
                       ("--train.batch_size", "9223372036854775808", "out of range for a 64-bit integer"),
                       ("--train.batch_size", "32abc", "expected an integer"), ("--train.batch_size", "1.5", "expected an integer"),
                       ("--train.momentum", "nan", "finite"), ("--train.momentum", "1.5", "must be in"),
                       ("--model.dropout", "nan", "finite"), ("--dp.bucket_mb", "nan", "finite"),
                       ("--dp.bucket_mb", "5000", "must be in"), ("--watchdog.timeout_s", "nan", "finite"),
                       ("--checkpoint.every_seconds", "-1", ">= 0"), ("--train.nesterov", "yes", "expected true or false"),
                       ("--dp.overlap", "1", "expected true or false"), ("--model.type", "rnn", "expected one of"),
                       ("--train.optimizer", "adam", "expected one of sgd, adamw"), ("--model.kernel", "0", "must be in"),
                       ("--parallel.pipeline_stages", "5000", "must be in"), ("--train.seed", "-1", ">= 0")]:
        flag(f"{f_} {v!r}", [f_, v], re.escape("flag " + f_) + ": .*" + re.escape(why).replace("\\.\\*", ".*"))
    flag("--model.hidden with a negative width", ["--model.hidden", "8", "-3"], r"flag --model\.hidden: element 2: must be in")
    flag("--model.hidden with a zero width", ["--model.hidden", "0"], r"flag --model\.hidden: element 1: must be in")
    flag("--data.path with a newline", ["--data.path", "a\nb"], r"flag --data\.path: contains a control character")
    flag("--threads 0", ["--threads", "0"], r"flag --threads: must be in \[1, 1024\]")
    flag("--threads 2000", ["--threads", "2000"], r"flag --threads: must be in \[1, 1024\]")
    flag("--threads 0x2", ["--threads", "0x2"], r"flag --threads: expected an integer, got '0x2'")
    flag("--threads 1.5", ["--threads", "1.5"], r"flag --threads: expected an integer")
    flag("--trace_steps 0", ["--trace_steps", "0"], r"flag --trace_steps: must be in")
    flag("--device tpu", ["--device", "tpu"], r"--device tpu: expected auto, cuda or cpu")
    flag("--progress fancy", ["--progress", "fancy"], r"--progress")
    flag("--resume of a missing file", ["--resume", "{C}/none.h5"], r"none\.h5: cannot open \(No such file")
    flag("unknown flag", ["--train.epoch", "3"], r"train\.epoch")
    flag("--config given twice: the last counts", ["--config", "{C}/a.toml", "--config", "{C}/b.toml"],
         r"config .*/b\.toml: cannot open")
    gen = [S, "generate", "--checkpoint", fx.gpt_params, "--tokens", "2"]
    for f_, v, why in [("--temperature", "nan", "finite"), ("--temperature", "-1", "must be in"),
                       ("--tokens", "-1", "must be in"), ("--top_k", "1e3", "expected an integer"),
                       ("--seed", "-1", "must be in"), ("--threads", "0", "must be in")]:
        out["flags"].append(Case(f"flags: generate {f_} {v}", gen + [f_, v], 2, re.escape("flag " + f_) + ": .*" + why))
    ev = [S, "eval", "--checkpoint", fx.mlp_params, "--data", D]
    out["flags"].append(Case("flags: eval --threads nan", ev + ["--threads", "nan"], 2, r"flag --threads: expected an integer"))
    out["flags"].append(Case("flags: eval --device tpu", ev + ["--device", "tpu"], 2, r"--device tpu"))
    out["flags"].append(Case("flags: prepare text --val_fraction nan",
                             [S, "prepare", "text", "--input", fx.path("text.txt"), "--out", "{C}/x.h5", "--val_fraction", "nan"],
                             2, r"--val_fraction nan: expected a fraction"))
    out["flags"].append(Case("flags: prepare text from /dev/zero",
                             [S, "prepare", "text", "--input", "/dev/zero", "--out", "{C}/x.h5"], 2,
                             r"/dev/zero: is a device or socket"))
    out["flags"].append(Case("flags: prepare text --out under a file",
                             [S, "prepare", "text", "--input", fx.path("text.txt"), "--out", "{C}/f/x.h5"], 2,
                             r"f/x\.h5: output directory .*/f is not a directory", make=file_with("x", "f")))
    # GPT-2's tokenizer (issue 31): its flags, and vocabularies that are missing, malformed or
    # inconsistent; each error names the file and line.
    ptext = [S, "prepare", "text", "--input", fx.path("text.txt"), "--out", "{C}/x.h5"]
    gvocab = ptext + ["--tokenizer", "gpt2", "--vocab", "{C}"]
    out["flags"].append(Case("flags: prepare text --tokenizer sentencepiece", ptext + ["--tokenizer", "sentencepiece"],
                             2, r"--tokenizer sentencepiece: unknown; expected bytes or gpt2"))
    out["flags"].append(Case("flags: prepare text --tokenizer gpt2 without --vocab", ptext + ["--tokenizer", "gpt2"],
                             2, r"--tokenizer gpt2 needs --vocab DIR"))
    out["flags"].append(Case("flags: prepare text --vocab with --tokenizer bytes", ptext + ["--vocab", "{C}"],
                             2, r"--vocab .*: is for --tokenizer gpt2"))
    out["flags"].append(Case("flags: generate --vocab for a model trained on bytes",
                             [S, "generate", "--checkpoint", fx.gpt_params, "--tokens", "2", "--vocab", "{C}"],
                             2, r"--vocab .*model\.h5 was trained on bytes"))
    out["data"].append(Case("data: gpt2 vocabulary directory missing",
                            ptext + ["--tokenizer", "gpt2", "--vocab", "{C}/none"], 2, r"/none: does not exist; --vocab names"))
    out["data"].append(Case("data: gpt2 encoder.json missing", gvocab, 2, r"encoder\.json: does not exist",
                            make=gpt2_vocab(text=None)))
    out["data"].append(Case("data: gpt2 encoder.json malformed", gvocab, 2,
                            r"encoder\.json: bad JSON at line 3, column 7 \(byte 16\): expected ':'", make=gpt2_vocab(text='{\n"a": 0,\n "b"  1}')))
    out["data"].append(Case("data: gpt2 encoder.json not JSON", gvocab, 2,
                            r"encoder\.json: bad JSON at line 1, column 1 \(byte 0\): expected a value", make=gpt2_vocab(text="<html>")))
    out["data"].append(Case("data: gpt2 encoder.json with a duplicate id", gvocab, 2,
                            r"encoder\.json: line 1, column \d+: token \"zz\" has id 40, which the token \"\(\" already has",
                            make=gpt2_vocab(extra_json={"zz": 40})))
    out["data"].append(Case("data: gpt2 encoder.json with a gap in the ids", gvocab, 2,
                            r"encoder\.json: no token has id 257", make=gpt2_vocab(extra_json={"zz": 300})))
    out["data"].append(Case("data: gpt2 vocab.bpe merge naming an unknown token", gvocab, 2,
                            r"vocab\.bpe: line 3: the merge \"q z\" names the merged token \"qz\", which is not in .*encoder\.json",
                            make=gpt2_vocab(merges=["l l", "q z"])))
    out["data"].append(Case("data: gpt2 vocab.bpe line not a merge", gvocab, 2,
                            r"vocab\.bpe: line 2: \"lll\" is not a merge", make=gpt2_vocab(merges=["lll"])))
    # An output that is also one of the command's inputs: refused before anything is written
    # (each input a copy in the case's directory, whose files must not change).
    def copy_as(src, name):
        return lambda d: shutil.copy(src, os.path.join(d, name))
    own = [S, "train", "--data.path", "{C}/d.h5", "--model.hidden", "8", "--train.batch_size", "8",
           "--train.max_steps", "1", "--output.dir", "{OUT}", "--quiet"]
    for name, argv, pattern, make in [
            ("eval --logits over its --data", [S, "eval", "--checkpoint", fx.mlp_params, "--data", "{C}/d.h5",
                                               "--logits", "{C}/d.h5"], r"--logits .*d\.h5: is also --data", copy_as(D, "d.h5")),
            ("eval --logits over its --checkpoint", [S, "eval", "--checkpoint", "{C}/m.h5", "--data", D, "--logits",
                                                     "{C}/m.h5"], r"--logits .*m\.h5: is also --checkpoint", copy_as(fx.mlp_params, "m.h5")),
            ("quantize --out over its --checkpoint", [S, "quantize", "--checkpoint", "{C}/m.h5", "--out", "{C}/m.h5"],
             r"--out .*m\.h5: is also --checkpoint", copy_as(fx.mlp_params, "m.h5")),
            ("export --out over its --checkpoint", [S, "export", "--checkpoint", "{C}/g.h5", "--format", "llmc", "--out",
                                                    "{C}/g.h5"], r"--out .*g\.h5: is also --checkpoint", copy_as(fx.gpt_params, "g.h5")),
            ("prepare text --out over its --input", [S, "prepare", "text", "--input", "{C}/t.txt", "--out", "{C}/t.txt"],
             r"--out .*t\.txt: is also --input", file_with("alpha beta gamma\n" * 50, "t.txt")),
            ("train output.params over data.path", own + ["--output.params", "{C}/d.h5"],
             r"output\.params .*d\.h5: is also data\.path", copy_as(D, "d.h5")),
            ("train output.metrics over data.path", own + ["--output.metrics", "{C}/d.h5"],
             r"output\.metrics .*d\.h5: is also data\.path", copy_as(D, "d.h5")),
            ("train --trace over data.path", own + ["--trace", "{C}/d.h5"],
             r"--trace .*d\.h5: is also data\.path", copy_as(D, "d.h5")),
            # Checked before the first step, not after the last: a run's work is never lost to it.
            ("train output.params where no file can be made", train + ["--output.params", "/proc/strata-model.h5"],
             r"output\.params /proc/strata-model\.h5: cannot create a file in directory /proc",
             None)]:
        out["flags"].append(Case(f"flags: {name}", argv, 2, pattern, make=make))
    out["flags"].append(Case("flags: eval --data given twice takes the last (must work)",
                             [S, "eval", "--checkpoint", fx.mlp_params, "--data", "{C}/none.h5", "--data", D], 0))
    out["flags"].append(Case("flags: --metrics and --output.metrics naming different files",
                             train + ["--metrics", "{C}/m1.jsonl", "--output.metrics", "{C}/m2.jsonl"], 2,
                             r"flag --metrics .*m1\.jsonl and --output\.metrics .*m2\.jsonl name one key: give one of them"))
    out["flags"].append(Case("flags: --prometheus and --output.prometheus naming different files",
                             train + ["--prometheus", "{C}/p1.prom", "--output.prometheus", "{C}/p2.prom"], 2,
                             r"flag --prometheus .*p1\.prom and --output\.prometheus .*p2\.prom name one key"))
    out["flags"].append(Case("flags: a scalar flag given twice takes the last", train + ["--train.lr", "nan", "--train.lr", "0.1"], 0))
    out["flags"].append(Case("flags: a list flag given twice takes the last",
                             train + ["--model.hidden", "0", "-1", "--model.hidden", "8"], 0))

    # A list flag's value as users write it: a TOML array (spaces, a trailing comma, lines),
    # as README shows the defaults; the repeated-value form too. Every list key.
    lists = {
        "--model.hidden": (["16", "8"], '[16, 8]', "[ 16 ,8 , ]", "[\n  16,\n  8\n]", []),
        "--model.channels": (["4", "8"], "[4, 8]", "[ 4 ,8 , ]", "[\n  4,\n  8,\n]", ["--model.type", "cnn"]),
        "--model.layers": (["flatten", "linear 8", "relu", "linear 4"], '["flatten", "linear 8", "relu", "linear 4"]',
                           '[ "flatten" ,"linear 8", "relu" , "linear 4" , ]',
                           '[\n  "flatten",\n  "linear 8",  # a comment\n  "relu",\n  "linear 4",\n]',
                           ["--model.type", "custom"]),
        "--parallel.stage_layers": (["3"], "[3]", "[ 3 , ]", "[\n  3\n]", []),
    }
    for key, (values, plain, spaced, lines, extra) in lists.items():
        for form, argv in (("repeated values", [key] + values), ("TOML array", [key, plain]),
                           ("spaces and a trailing comma", [key, spaced]), ("several lines", [key, lines]),
                           ("--key=[...]", [f"{key}={plain}"])):
            out["flags"].append(Case(f"flags: {key} as {form} (must work)", train + extra + argv, 0))
    flag("--model.hidden [16, 8 (not TOML)", ["--model.hidden", "[16, 8"],
         r"flag --model\.hidden: '\[16, 8' is not a TOML array")
    flag("--model.hidden [16, 1.5]", ["--model.hidden", "[16, 1.5]"],
         r"flag --model\.hidden: element 2 is a float \(1\.5\); expected an integer or a string")
    flag("--model.hidden [16, -3]", ["--model.hidden", "[16, -3]"], r"flag --model\.hidden: element 2: must be in")

    # The job scripts' questions (slurm/train.sbatch): a key as a run resolves it, and the
    # newest checkpoint that verifies.
    out["flags"].append(Case("flags: config --get checkpoint.dir follows --output.dir (must work)",
                             [S, "config", "--get", "checkpoint.dir", "--output.dir", "{C}/o", "--threads", "2"],
                             0, check_stdout=lambda s: s.strip().endswith("/o/checkpoints")))
    out["flags"].append(Case("flags: config --get train.lr of a file (must work)",
                             [S, "config", "--get", "train.lr", "--config", "{C}/c.toml"], 0,
                             make=file_with("[train]\nlr = 0.125\n"), check_stdout=lambda s: s.strip() == "0.125"))
    flag("config --get of an unknown key", [], r"--get train\.lrr: unknown key \(did you mean 'train\.lr'\?\)",
         base=[S, "config", "--get", "train.lrr"])

    def damaged_newest(case_dir):
        shutil.copytree(os.path.dirname(fx.mlp_ckpt), os.path.join(case_dir, "ck"))
        with open(os.path.join(case_dir, "ck", "ckpt-000000002.h5"), "r+b") as f:
            f.seek(-64, os.SEEK_END)
            f.write(b"\xff" * 64)  # the tensor data: a checksum mismatch
    out["flags"].append(Case("flags: checkpoint latest passes over a damaged newest checkpoint (must work)",
                             [S, "checkpoint", "latest", "{C}/ck"], 0, make=damaged_newest,
                             check_stdout=lambda s: s.strip().startswith("1 ") and s.strip().endswith("ckpt-000000001.h5")))
    out["flags"].append(Case("flags: checkpoint latest of an empty directory says -1 (must work)",
                             [S, "checkpoint", "latest", "{C}"], 0, check_stdout=lambda s: s.strip() == "-1"))
    out["flags"].append(Case("flags: checkpoint latest of a directory not made yet says -1 (must work)",
                             [S, "checkpoint", "latest", "{C}/none"], 0, check_stdout=lambda s: s.strip() == "-1"))
    out["flags"].append(Case("flags: checkpoint latest of a file", [S, "checkpoint", "latest", "{C}/f"], 2,
                             r"checkpoint latest .*/f: not a directory", make=file_with("x", "f")))
    out["flags"].append(Case("flags: checkpoint latest of an empty path", [S, "checkpoint", "latest", ""], 2,
                             r"checkpoint latest: DIR is empty"))

    # Typos on the command line, in strata's words (as the config file's unknown keys): an
    # unknown command, and an unknown flag of every command, each with the closest name.
    flag("unknown command", [], r"^strata: error: unknown command 'trian' \(did you mean 'train'\?\); the commands: train, ",
         base=[S, "trian"])
    flag("no command", [], r"^strata: error: strata needs a command: train, .*prepare, eval, .*devices", base=[S])
    flag("unknown command of prepare", [], r"unknown command 'txt' of strata prepare \(did you mean 'text'\?\)",
         base=[S, "prepare", "txt"])
    for cmd, flag_, near in [([S, "train"], "--train.epoch", "--train.epochs"),
                             ([S, "eval", "--checkpoint", fx.mlp_params], "--dat", "--data"),
                             ([S, "generate", "--checkpoint", fx.gpt_params], "--token", "--tokens"),
                             ([S, "quantize", "--checkpoint", fx.mlp_params], "--outt", "--out"),
                             ([S, "prepare", "text"], "--inputs", "--input"),
                             ([S, "prepare", "fashion-mnist"], "--sorce", "--source"),
                             ([S, "inspect", fx.mlp_params], "--jsn", None),
                             ([S, "devices"], "--al", None)]:
        name = " ".join(c for c in cmd[1:3] if not c.startswith("/") and not c.startswith("--"))
        suggestion = rf" \(did you mean {re.escape(near)}\?\)" if near else ""
        flag(f"unknown flag of {name}: {flag_}", [flag_, "3"],
             rf"^strata: error: unknown flag {re.escape(flag_)}{suggestion}; strata {re.escape(name)} --help lists its flags",
             base=cmd)

    # `strata bench comm` (issue 32): sizes, ops, --out, and one rank (these run on one rank,
    # so each flag's own error comes before the one about the rank count).
    bench = [S, "bench", "comm", "--out", "{C}/p.json"]
    for name, args, pattern in [
            ("--max_bytes 1.5M", ["--max_bytes", "1.5M"], r"flag --max_bytes: expected a size in bytes .* got '1\.5M'"),
            ("--max_bytes 8G", ["--max_bytes", "8G"], r"flag --max_bytes: expected a size in bytes from 1 to 4G"),
            ("--min_bytes 0", ["--min_bytes", "0"], r"flag --min_bytes: expected a size in bytes"),
            ("--min_bytes 24", ["--min_bytes", "24"], r"flag --min_bytes: 24 bytes is not a power of 2"),
            ("--min_bytes 2", ["--min_bytes", "2"], r"flag --min_bytes: 2 bytes is not a power of 2 of at least 4"),
            ("--min_bytes over --max_bytes", ["--min_bytes", "1M", "--max_bytes", "64K"],
             r"flag --min_bytes: 1048576 is more than --max_bytes 65536"),
            ("--ops alltoall", ["--ops", "allreduce,alltoall"], r"flag --ops: unknown op 'alltoall'; the ops: allreduce, "),
            ("--ops as typed, with spaces and brackets (parsed; then one rank is too few)",
             ["--ops", "[allreduce, sendrecv]"], r"bench comm: 1 rank: the collectives and send/receive need at least 2"),
            ("--iters 0", ["--iters", "0"], r"flag --iters: must be in \[1, 1000000\], got 0"),
            ("--device tpu", ["--device", "tpu"], r"--device: tpu not in"),
            ("one rank", [], r"bench comm: 1 rank: the collectives and send/receive need at least 2")]:
        out["flags"].append(Case(f"flags: bench comm {name}", bench + args, 2, pattern))
    out["flags"].append(Case("flags: bench comm --out under a file", [S, "bench", "comm", "--out", "{C}/f/p.json"], 2,
                             r"--out .*/f/p\.json: cannot create directory", make=file_with("x", name="f")))
    out["flags"].append(Case("flags: bench comm --out a directory", [S, "bench", "comm", "--out", "{C}"], 2,
                             r"--out .*: is a directory; expected a file"))

    # `strata plan` (issue 32): the ranks, the memory, the config and the profile it reads; and
    # `train --parallel.auto` with a memory no grid fits (one line naming the smallest grid).
    plan = [S, "plan"] + fx.mlp_args()
    for name, args, pattern in [
            ("--nodes 0", ["--nodes", "0", "--ranks_per_node", "2"], r"flag --nodes: must be in \[1, "),
            ("--nodes abc", ["--nodes", "abc", "--ranks_per_node", "2"], r"flag --nodes: expected an integer, got 'abc'"),
            ("--nodes -4", ["--nodes", "-4", "--ranks_per_node", "2"], r"flag --nodes: must be in \[1, "),
            ("--ranks_per_node 0", ["--nodes", "1", "--ranks_per_node", "0"], r"flag --ranks_per_node: must be in \[1, 4096\]"),
            ("without --nodes", ["--ranks_per_node", "2"], r"--nodes is required"),
            ("--memory_per_rank lots", ["--nodes", "1", "--ranks_per_node", "2", "--memory_per_rank", "lots"],
             r"--memory_per_rank lots: must be a byte count from 1 to 1e18 \(2e9, 80GB, 64GiB\) or auto"),
            ("--memory_per_rank 0", ["--nodes", "1", "--ranks_per_node", "2", "--memory_per_rank", "0"],
             r"--memory_per_rank 0: must be a byte count"),
            ("--top 0", ["--nodes", "1", "--ranks_per_node", "2", "--top", "0"], r"flag --top: must be in"),
            ("a missing config", ["--nodes", "1", "--ranks_per_node", "2", "--config", "{C}/none.toml"], r"none\.toml"),
            ("a malformed profile", ["--nodes", "1", "--ranks_per_node", "2", "--profile", "{C}/p.json"], r"p\.json"),
            ("a missing comm profile", ["--nodes", "1", "--ranks_per_node", "2", "--comm", "{C}/none.json"], r"none\.json"),
            ("more ranks than it plans", ["--nodes", "524288", "--ranks_per_node", "4096"],
             r"--nodes 524288 x --ranks-per-node 4096 = 2147483648 ranks: strata plan plans at most 1048576"),
            ("more ranks per node than the cluster file's", ["--nodes", "1", "--ranks_per_node", "16", "--cluster", H100],
             r"--ranks-per-node 16: the cluster description .*h100-nvlink4-ndr400\.toml has ranks_per_node = 8"),
            ("a grid refused by every check", ["--nodes", "1", "--ranks_per_node", "8", "--train.batch_size", "7"],
             r"no grid of 8 ranks passes the config's checks")]:
        out["flags"].append(Case(f"flags: plan {name}", plan + args, 2, pattern,
                                 make=file_with('{"strata_machine_profile": 1, "layers": [', name="p.json")))
    for name, fields, pattern in [
            ("a device strata does not measure", '"device": "tpu", "precision": "fp32", "threads": 1, "cores": 1',
             r"p\.json: key \"device\": \"tpu\" is not a device strata measures"),
            ("threads past any machine", '"device": "cpu", "precision": "fp32", "threads": 1e30, "cores": 1',
             r"p\.json: key \"threads\": 1e\+30 is not a count from 1 to 1e6")]:
        out["flags"].append(Case(f"flags: plan a profile with {name}",
                                 plan + ["--nodes", "1", "--ranks_per_node", "2", "--profile", "{C}/p.json"], 2, pattern,
                                 make=file_with('{"strata_machine_profile": 1, ' + fields + ', "layers": []}', name="p.json")))
    # The keys --parallel.auto plans with are strata plan's too, unless a flag says otherwise.
    out["flags"].append(Case("flags: plan takes parallel.memory_per_rank (must work)",
                             plan + ["--nodes", "1", "--ranks_per_node", "2", "--parallel.memory_per_rank", "3e9"], 0,
                             check_stdout=lambda s: "3.0 GB (parallel.memory_per_rank 3e+09)" in s
                             or "(parallel.memory_per_rank 3000000000)" in s))
    out["flags"].append(Case("flags: plan --memory_per_rank with a unit (must work)",
                             plan + ["--nodes", "1", "--ranks_per_node", "2", "--memory_per_rank", "64GiB"], 0,
                             check_stdout=lambda s: "--memory_per_rank 64GiB" in s))
    out["flags"].append(Case("flags: plan of a GPT without data or vocabulary",
                             [S, "plan", "--model.type", "gpt", "--data.path", "{C}/none.h5", "--nodes", "1",
                              "--ranks_per_node", "1"], 2, r"none\.h5: cannot open"))
    out["flags"].append(Case("flags: train --parallel.auto with memory no grid fits", train + [
        "--parallel.auto", "true", "--parallel.memory_per_rank", "1e6"], 2,
        r"^strata: error: the config: no grid of 1 rank fits 1 MB per rank \(parallel\.memory_per_rank = 1e\+06\): "
        r"the smallest needs \d+ MB \(D 1 x P \d x T 1, ZeRO 0.*\); give more ranks or memory$"))
    out["flags"].append(Case("flags: train --parallel.memory_per_rank -1", train + ["--parallel.memory_per_rank", "-1"], 2,
                             r"flag --parallel\.memory_per_rank: must be in"))
    # `strata bench layers` and the step-time model's inputs (issue 32): a config whose data is
    # missing, bad flags; a machine profile malformed or of another version, a comm profile of
    # another version, a cluster description missing a key (bench predict reads them all).
    layers = [S, "bench", "layers", "--quiet", "--checkpoint_dir", "{C}/ck", "--out", "{C}/m.json"] + fx.mlp_args()
    out["config"].append(Case("config: bench layers on missing data", layers + ["--data.path", "{C}/none.h5"], 2,
                              r"none\.h5"))
    out["flags"].append(Case("flags: bench layers --resume", layers + ["--resume", "auto"], 2,
                             r"bench layers: --resume does not apply"))
    out["flags"].append(Case("flags: bench layers --micro_batches 0", layers + ["--micro_batches", "0"], 2,
                             r"flag --micro_batches: must be in \[1, 1048576\], got 0"))
    # CLI11's own messages, in strata's words.
    out["flags"].append(Case("flags: a config file given without --config", train + ["{C}/c.toml"], 2,
                             r"unexpected argument '.*c\.toml' \(a config file is given as --config .*c\.toml\)"))
    out["flags"].append(Case("flags: --resume of an empty path", train + ["--resume", ""], 2,
                             r"flag --resume: empty; give never, auto or a checkpoint file"))
    out["flags"].append(Case("flags: --config of an empty path", train + ["--config", ""], 2,
                             r"flag --config: an empty path; give a TOML file"))
    out["flags"].append(Case("flags: --resume given twice (slurm/train.sbatch passes its own)",
                             train + ["--resume", "auto", "--resume", "never"], 2, r"flag --resume: given 2 times; give it once"))
    out["flags"].append(Case("flags: a checked flag without its value", [S, "plan"] + fx.mlp_args() + ["--ranks_per_node", "1", "--nodes"],
                             2, r"flag --nodes: needs a value"))
    out["flags"].append(Case("flags: a flag without its value", train + ["--train.nesterov"], 2,
                             r"flag --train\.nesterov: needs a value"))
    out["flags"].append(Case("flags: bench layers --out a directory", layers[:-len(fx.mlp_args()) - 2] + ["--out", "{C}"]
                             + fx.mlp_args(), 2, r"--out .*: is a directory; expected a file"))
    predict = [S, "bench", "predict", "--profile", "{C}/m.json"] + fx.mlp_args()
    for name, text, pattern in [
            ("malformed", '{"strata_machine_profile": 1, "layers": [', r"m\.json: bad JSON at line 1"),
            ("of another version", '{"strata_machine_profile": 7}', r"m\.json: key \"strata_machine_profile\": not version 1"),
            ("without layers", '{"strata_machine_profile": 1, "device": "cpu", "precision": "fp32", "threads": 1, "cores": 2}',
             r"m\.json: key \"layers\" missing"),
            ("with a negative whole pass", '{"strata_machine_profile": 1, "device": "cpu", "precision": "fp32", '
             '"threads": 1, "cores": 2, "layers": [{"index": 0, "name": "fc1", "kind": "Linear(784 -> 64)", '
             '"params": 1, "flops": 1, "optimizer_s": 0, "at": [{"micro_batch": 8, "forward_s": 1, "backward_s": 1, '
             '"backward_input_s": 1, "backward_weight_s": 1}]}], "loss": {"at": [{"micro_batch": 8, "forward_s": 0}]}, '
             '"whole": {"at": [{"micro_batch": 8, "forward_s": -1}]}}',
             r"m\.json: key \"whole\.at\[0\]\.forward_s\" must be a number >= 0")]:
        out["config"].append(Case(f"config: machine profile {name}", predict, 2, pattern,
                                  make=file_with(text, name="m.json")))
    out["config"].append(Case("config: comm profile of another version", predict + ["--comm_profile", "{C}/c.json"], 2,
                              r"c\.json: key \"strata_comm_profile\": version 2",
                              make=file_with('{"strata_comm_profile": 2, "fit": {}}', name="c.json")))
    out["config"].append(Case("config: cluster description missing a key", predict + ["--cluster", "{C}/c.toml"], 2,
                              r"c\.toml: key \"inter\.latency_us\" missing",
                              make=file_with('name = "x"\nranks_per_node = 8\ntopology = "fat-tree"\n[intra]\n'
                                             'bandwidth_GBps = 450\nlatency_us = 3\n[inter]\nbandwidth_GBps = 50\n')))
    out["config"].append(Case("config: cluster description with another topology", predict + ["--cluster", "{C}/c.toml"], 2,
                              r"c\.toml:3:\d+: key \"topology\" must be \"fat-tree\" or \"rail-optimised\"",
                              make=file_with('name = "x"\nranks_per_node = 8\ntopology = "torus"\n')))

    # ---- inputs the fuzzers found (tests/fuzz/regressions) ----
    reg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "regressions")
    for name in sorted(os.listdir(os.path.join(reg, "config"))):
        out["config"].append(Case(f"config: fuzzer regression {name}", train + ["--config", os.path.join(reg, "config", name)],
                                  2, re.escape(name) + r":\d+:\d+: a non-ASCII character outside a string or comment"))

    # ---- data files (images) ----
    def data(name, make, pattern, extra=()):
        out["data"].append(Case(f"data: {name}", train + ["--data.path", "{C}/in.h5"] + list(extra), 2, pattern, make=make))
    f32 = img.astype(np.float32) / 255
    data("not HDF5", file_with("not an HDF5 file\n", "in.h5"), r"in\.h5: not an HDF5 file")
    data("empty file", file_with("", "in.h5"), r"in\.h5: (not an HDF5 file|cannot open)")
    data("missing labels", dataset(img, None), r"in\.h5: missing dataset /train/labels")
    data("missing images", dataset(None, lab), r"in\.h5: missing dataset /train/images")
    data("float64 images", dataset(img.astype(np.float64), lab), r"in\.h5: /train/images has dtype float64")
    data("int16 images", dataset(img.astype(np.int16), lab), r"in\.h5: /train/images has dtype")
    data("float labels", dataset(img, lab.astype(np.float32)), r"in\.h5: /train/labels has dtype")
    data("images of rank 1", dataset(img.reshape(-1), lab), r"in\.h5: /train/images has shape")
    data("images of rank 5", dataset(img.reshape(16, 1, 1, 8, 8), lab), r"in\.h5: /train/images has shape")
    data("labels of rank 2", dataset(img, lab.reshape(16, 1)), r"in\.h5: /train/labels has shape")
    data("zero rows", dataset(np.zeros((0, 8, 8), np.uint8), np.zeros(0, np.uint8)), r"in\.h5: /train/images has no rows")
    data("empty samples", dataset(np.zeros((16, 0, 8), np.uint8), lab), r"in\.h5: /train/images has shape")
    data("row mismatch", dataset(img, lab[:15]), r"in\.h5: /train/labels has 15 rows")
    bad = lab.copy()
    bad[3] = 4
    data("label out of range", dataset(img, bad, attrs={"classes": 4}), r"in\.h5: /train/labels\[3\] = 4 is out of range")
    neg = lab.astype(np.int32)
    neg[5] = -1
    data("negative label", dataset(img, neg), r"in\.h5: /train/labels\[5\] = -1 is out of range")
    for c in (0, -1, 10**9):
        data(f"classes = {c}", dataset(img, lab, attrs={"classes": np.int64(c)}), r"in\.h5: root attribute classes = ")
    data("classes as a string", dataset(img, lab, attrs={"classes": "four"}), r"in\.h5: root attribute classes has dtype")
    nan = f32.copy()
    nan[2, 3, 4] = np.nan
    data("NaN in /train/images", dataset(nan, lab), r"in\.h5: /train/images sample 2 holds NaN")
    # Found by fuzz_dataset: HDF5 writes past a heap block reading a string attribute, glibc
    # aborts; the read guard turns it into exit 2 naming the file.
    data("HDF5 corrupts the heap on it (glibc abort)", lambda d: shutil.copy(DATA_ABORT, os.path.join(d, "in.h5")),
         r"in\.h5: reading it crashed HDF5: its HDF5 structures are damaged$")
    inf = f32.copy()
    inf[7, 0, 0] = np.inf
    data("Inf in /test/images", dataset(f32, lab, test={"test/images": inf, "test/labels": lab}),
         r"in\.h5: /test/images sample 7 holds Inf")
    data("test sample shape differs", dataset(img, lab, test={"test/images": img[:, :4, :], "test/labels": lab}),
         r"in\.h5: /test/images has sample shape")
    data("kind attribute unknown", dataset(img, lab, attrs={"kind": "video"}), r"in\.h5: root attribute kind = \"video\"")
    data("a directory", None, r"(cannot open|not an HDF5)", ())
    out["data"][-1].argv = train + ["--data.path", "{C}"]
    data("damaged HDF5 metadata (found by fuzz_dataset)",
         lambda d: shutil.copy(os.path.join(reg, "dataset", "hdf5-message-not-aligned.h5"), os.path.join(d, "in.h5")),
         r"in\.h5: damaged or unreadable HDF5 file \(HDF5 call H5Oopen failed")
    data("model does not fit the data", dataset(img, lab), r"model: the last layer gives",
         ["--model.type", "custom", "--model.layers", "flatten", "linear 3"])
    data("model larger than memory", dataset(img, lab), r"rank 0: layer fc2 = .* needs .*; this node has .* available",
         ["--model.hidden", "16000000", "16000000"])
    data("batch larger than the data", dataset(img, lab), r"train\.batch_size = 32 is larger than the 16 training samples",
         ["--train.batch_size", "32"])

    # ---- token files ----
    def tok(name, fn, pattern, extra=()):
        out["tokens"].append(Case(f"tokens: {name}", gtrain + ["--data.path", "{C}/in.h5"] + list(extra), 2, pattern,
                                  make=mutated(fx.tokens, fn)))

    def set_tokens(split, arr):
        def fn(f):
            del f[f"{split}/tokens"]
            f[f"{split}/tokens"] = arr
        return fn
    n = 12000
    tok("id beyond the vocabulary", set_tokens("train", np.full(n, 300, np.uint16)), r"in\.h5: /train/tokens\[0\] = 300 is out of range \[0, 256\)")
    tok("negative id", set_tokens("train", np.full(n, -2, np.int32)), r"in\.h5: /train/tokens\[0\] = -2 is out of range")
    tok("float tokens", set_tokens("train", np.zeros(n, np.float32)), r"in\.h5: /train/tokens has dtype float32")
    tok("int64 tokens", set_tokens("train", np.zeros(n, np.int64)), r"in\.h5: /train/tokens has dtype int64")
    tok("2-D tokens", set_tokens("train", np.zeros((n // 4, 4), np.uint8)), r"in\.h5: /train/tokens has shape")
    tok("no tokens", set_tokens("train", np.zeros(0, np.uint8)), r"in\.h5: /train/tokens has no tokens")
    tok("val tokens out of range", set_tokens("val", np.full(2000, 256, np.uint16)), r"in\.h5: /val/tokens\[0\] = 256 is out of range")

    def set_attr(k, v):
        return lambda f: f.attrs.__setitem__(k, v)
    tok("vocab 0", set_attr("vocab", np.int64(0)), r"in\.h5: root attribute vocab = 0")
    tok("vocab -1", set_attr("vocab", np.int64(-1)), r"in\.h5: root attribute vocab = -1")
    tok("vocab 2^25", set_attr("vocab", np.int64(1 << 25)), r"in\.h5: root attribute vocab = 33554432")
    tok("vocab as a float", set_attr("vocab", 256.0), r"in\.h5: root attribute vocab has dtype")
    tok("entropy NaN", set_attr("unigram_entropy_nats", np.nan), r"in\.h5: root attribute unigram_entropy_nats = nan")
    tok("shorter than the context", lambda f: None, r"in\.h5: /train/tokens has \d+ tokens; model\.context = 100000",
        ["--model.context", "100000"])
    tok("model.vocab differs", lambda f: None, r"model\.vocab = 100, but .*in\.h5 has a vocabulary of 256", ["--model.vocab", "100"])
    tok("tokens for an mlp", lambda f: None, r"in\.h5: holds tokens, which model\.type = \"mlp\"", ["--model.type", "mlp"])
    tok("model.dim beyond 2^24", lambda f: None, r"flag --model\.dim: must be in \[1, 16777216\]", ["--model.dim", "100000000"])
    tok("blocks larger than memory", lambda f: None, r"needs .*; this node has .* available", ["--model.dim", "16000000",
        "--model.heads", "1"])

    # ---- model.preset (issue 31): unknown names, keys that disagree, data the preset does not fit ----
    conf("unknown model.preset", '[model]\npreset = "gpt3"\n',
         key_re + r"model\.preset: expected one of none, gpt2, gpt2-medium, gpt2-large, gpt2-xl, got 'gpt3'")
    conf("model.preset with a conflicting model.dim", '[model]\npreset = "gpt2"\ndim = 512\n',
         r"c\.toml:3:\d+: model\.dim = 512 conflicts with model\.preset = \"gpt2\" \(config .*c\.toml:2:\d+\), "
         r"which sets model\.dim = 768")
    conf("model.preset with model.type = mlp", '[model]\ntype = "mlp"\npreset = "gpt2-xl"\n',
         r"c\.toml:2:\d+: model\.type = \"mlp\" conflicts with model\.preset = \"gpt2-xl\"")
    out["flags"].append(Case("flags: --model.heads conflicting with model.preset in the file", cfg + ["--model.heads", "4"],
                             2, r"flag --model\.heads: model\.heads = 4 conflicts with model\.preset = \"gpt2-medium\" "
                             r"\(config .*c\.toml:2:\d+\), which sets model\.heads = 16",
                             make=file_with('[model]\npreset = "gpt2-medium"\n')))
    out["flags"].append(Case("flags: --model.preset conflicting with model.layers in the file",
                             cfg + ["--model.preset", "gpt2"], 2,
                             r"config .*c\.toml:2:\d+: model\.layers = 6 conflicts with model\.preset = "
                             r"\"gpt2\" \(flag --model\.preset\), which sets model\.layers = 12",
                             make=file_with('[model]\nlayers = 6\n')))
    tok("model.preset on byte tokens", lambda f: None,
        r"model\.vocab = 50257 \(model\.preset = \"gpt2\"\), but .*in\.h5 has a vocabulary of 256",
        ["--model.preset", "gpt2", "--model.type", "gpt", "--model.layers", "12", "--model.heads", "12",
         "--model.dim", "768", "--model.context", "1024"])

    def bpe_sized(tokens):
        def fn(f):
            set_tokens("train", tokens)(f)
            set_tokens("val", tokens)(f)
            f.attrs["vocab"] = np.int64(50257)
        return fn
    preset_flags = ["--model.preset", "gpt2", "--model.layers", "12", "--model.heads", "12", "--model.dim", "768",
                    "--model.context", "1024"]
    tok("model.preset's context beyond the data", bpe_sized(np.arange(1000, dtype=np.uint16)),
        r"in\.h5: /train/tokens has 1000 tokens; model\.context = 1024 needs at least 1025", preset_flags)

    # ---- token shards: llm.c's (1024-byte header) and nanoGPT's (headerless uint16) ----
    def llmc_bytes(tokens, magic=20240520, version=1, count=None):
        header = np.zeros(256, np.int32)
        header[:3] = (magic, version, len(tokens) if count is None else count)
        return header.tobytes() + np.asarray(tokens, "<u2").tobytes()

    def files(**named):  # name -> bytes, written into the case's directory
        def make(case_dir):
            for name, data in named.items():
                with open(os.path.join(case_dir, name.replace("__", ".")), "wb") as f:
                    f.write(data)
        return make

    def shard(name, make, pattern, path="{C}/*_train_*.bin", extra=()):
        out["tokens"].append(Case(f"tokens: shards: {name}", gtrain + ["--data.path", path] + list(extra), 2, pattern,
                                  make=make))
    ok = np.arange(3000) % 200
    shard("glob matches nothing", files(), r"data\.path = '.*\*_train_\*\.bin': the glob matches no file$")
    shard("not a known format (auto)", files(a_train_1__bin=b"\x01\x02" * 100),
          r"a_train_1\.bin: cannot tell its format \(no HDF5 signature, no llm\.c magic 20240520, not named "
          r"train\.bin or val\.bin\): set data\.format")
    shard("wrong magic", files(a_train_1__bin=llmc_bytes(ok, magic=20240326)),
          r"a_train_1\.bin: magic 20240326 in its header; an llm\.c token shard has 20240520$", extra=["--data.format", "llmc"])
    shard("wrong version", files(a_train_1__bin=llmc_bytes(ok, version=2)),
          r"a_train_1\.bin: llm\.c shard version 2; strata reads version 1 \(uint16 tokens\)$")
    shard("size not 1024 + 2 x count", files(a_train_1__bin=llmc_bytes(ok, count=4000)),
          r"a_train_1\.bin: has 7024 bytes, but its header counts 4000 tokens \(1024 \+ 2 x 4000 = 9024 bytes\)$")
    shard("shorter than the header", files(a_train_1__bin=b"\0" * 100),
          r"a_train_1\.bin: has 100 bytes, fewer than the 1024 of an llm\.c shard's header$", extra=["--data.format", "llmc"])
    shard("header counts no tokens", files(a_train_1__bin=llmc_bytes([])), r"a_train_1\.bin: its header counts 0 tokens")
    bad = ok.copy()
    bad[7] = 50257
    shard("token id >= vocabulary (file and byte named)", files(a_train_1__bin=llmc_bytes(ok), a_train_2__bin=llmc_bytes(bad)),
          r"a_train_2\.bin: token at byte 1038 = 50257 is out of range \[0, 50257\) \(model\.vocab, or GPT-2's 50257", extra=["--model.vocab", "0"])
    shard("token id >= model.vocab", files(a_train_1__bin=llmc_bytes(ok)),
          r"a_train_1\.bin: token at byte 1224 = 100 is out of range \[0, 100\)",
          extra=["--model.vocab", "100"])
    shard("validation shard token out of range", files(a_train_1__bin=llmc_bytes(ok), a_val_1__bin=llmc_bytes(bad)),
          r"a_val_1\.bin: token at byte 1038 = 50257 is out of range", extra=["--model.vocab", "0"])
    shard("a list mixing formats", files(a_train_1__bin=llmc_bytes(ok), train__bin=np.asarray(ok, "<u2").tobytes()),
          r"data\.path: .*a_train_1\.bin is an llm\.c token shard but .*train\.bin is nanoGPT's headerless uint16 "
          r"tokens; one format per path$", path='["{C}/a_train_1.bin", "{C}/train.bin"]')
    shard("a missing file in a list", files(a_train_1__bin=llmc_bytes(ok)), r"b\.bin: cannot open \(No such file",
          path='["{C}/a_train_1.bin", "{C}/b.bin"]')
    shard("nanoGPT train.bin of odd size", files(train__bin=b"\0" * 4001),
          r"train\.bin: has 4001 bytes, an odd number; nanoGPT's \.bin holds uint16 tokens", path="{C}/train.bin")
    shard("nanoGPT train.bin empty", files(train__bin=b""), r"train\.bin: is empty; it holds no tokens$", path="{C}/train.bin")
    shard("nanoGPT token >= model.vocab", files(train__bin=np.full(3000, 300, "<u2").tobytes()),
          r"train\.bin: token at byte 0 = 300 is out of range \[0, 256\)", path="{C}/train.bin", extra=["--model.vocab", "256"])
    shard("data.val_path on an HDF5 file", None, r"data\.val_path = '.*': applies to token shards; .* is HDF5",
          path=fx.tokens, extra=["--data.val_path", "{C}/v.bin"])
    shard("shards shorter than the context", files(a_train_1__bin=llmc_bytes(ok[:5])),
          r"\*_train_\*\.bin: train split has 5 tokens; model\.context = 8 needs at least 9")

    # ---- checkpoints: train --resume PATH / auto, inspect ----
    resume = train + ["--train.max_steps", "3", "--resume", "{C}/in.h5"]

    def ck(name, fn, pattern, code=4, also_inspect=True, src=None):
        out["checkpoint"].append(Case(f"checkpoint: {name} (train --resume)", resume, code, pattern,
                                      make=mutated(src or fx.mlp_ckpt, fn)))
        if also_inspect:
            out["checkpoint"].append(Case(f"checkpoint: {name} (inspect)", [S, "inspect", "{C}/in.h5"], code,
                                          pattern, make=mutated(src or fx.mlp_ckpt, fn)))
    ck("missing /params/fc2/bias", lambda f: f.__delitem__("params/fc2/bias"), r"in\.h5: tensor /params/fc2/bias is missing")
    ck("fc2/bias of shape (20,) with a valid CRC", lambda f: replace_tensor(f, "params/fc2/bias", np.zeros(20)),
       r"in\.h5: /params/fc2/bias has shape \(20,\); the model in the file \(model_layers\) needs \(4,\)")
    ck("bad CRC", lambda f: f["params/fc1/weight"].__setitem__((0, 0), 5.0), r"in\.h5: tensor /params/fc1/weight fails its checksum",
       also_inspect=False)
    out["checkpoint"].append(Case("checkpoint: bad CRC (inspect lists it, exit 4)", [S, "inspect", "{C}/in.h5"], 4,
                                  r"in\.h5: 1 of \d+ tensors do not verify", make=mutated(fx.mlp_ckpt, lambda f: f["params/fc1/weight"].__setitem__((0, 0), 5.0))))
    ck("NaN with a valid CRC", lambda f: replace_tensor(f, "params/fc1/bias", np.full(8, np.nan)),
       r"in\.h5: tensor /params/fc1/bias holds 8 NaN/Inf values", also_inspect=False)
    ck("float64 tensor", lambda f: (f.__delitem__("params/fc2/bias"), f.create_dataset("params/fc2/bias", data=np.zeros(4))),
       r"in\.h5: /params/fc2/bias is not float32")
    ck("format_version 999", set_attr("format_version", np.int64(999)), r"in\.h5: format_version 999 is not one this strata reads")
    ck("format_version missing", lambda f: f.attrs.__delitem__("format_version"), r"in\.h5: root attribute 'format_version' is missing")
    ck("step -5", set_attr("step", np.int64(-5)), r"in\.h5: root attribute step = -5 is out of range")
    ck("epoch -1", set_attr("epoch", np.int64(-1)), r"in\.h5: root attribute epoch = -1 is out of range")
    ck("batch_in_epoch -1", set_attr("batch_in_epoch", np.int64(-1)), r"in\.h5: root attribute batch_in_epoch = -1")
    ck("sequence 0", set_attr("sequence", np.int64(0)), r"in\.h5: root attribute sequence = 0 is out of range")
    ck("global_batch 0", set_attr("global_batch", np.int64(0)), r"in\.h5: root attribute global_batch = 0")
    ck("optimizer adam", set_attr("optimizer", "adam"), r"in\.h5: root attribute optimizer = 'adam' is not sgd or adamw")
    ck("momentum state missing", lambda f: f.__delitem__("optimizer/momentum/fc1/weight"),
       r"in\.h5: tensor /optimizer/momentum/fc1/weight is missing")
    ck("momentum state of the wrong shape", lambda f: replace_tensor(f, "optimizer/momentum/fc1/bias", np.zeros(3)),
       r"in\.h5: /optimizer/momentum/fc1/bias has shape \(3,\)")
    ck("model_layers garbage", set_attr("model_layers", "\x01\x02 zz"), r"in\.h5: root attribute model_layers: ")
    ck("model_layers unknown layer", set_attr("model_layers", "flatten\ndense 8\nrelu\nlinear 4\n"),
       r"in\.h5: root attribute model_layers: 'dense 8': unknown layer 'dense'")
    ck("model_layers linear 10000000", set_attr("model_layers", "flatten\nlinear 10000000\nrelu\nlinear 4\n"),
       r"in\.h5: /(params|optimizer/momentum)/fc1/bias has shape \(8,\); the model in the file \(model_layers\) needs \(10000000,\)")
    ck("model_layers linear 1000000000", set_attr("model_layers", "flatten\nlinear 1000000000\nrelu\nlinear 4\n"),
       r"in\.h5: root attribute model_layers: 'linear 1000000000': 1000000000 is larger than 16777216")
    ck("input_shape empty", set_attr("input_shape", np.zeros(0, np.int64)),
       r"in\.h5: (root attribute input_shape = .* is not a sample shape|missing model description attributes)")
    ck("input_shape huge", set_attr("input_shape", np.array([1, 100000, 100000], np.int64)), r"in\.h5: root attribute input_shape")
    ck("classes 0", set_attr("classes", np.int64(0)), r"in\.h5: root attribute classes = 0 is out of range")
    ck("a foreign dataset", lambda f: f.create_dataset("params/extra", data=np.zeros(2, np.float32)),
       r"in\.h5: holds /params/extra, which is not a tensor of the model")
    ck("not a strata file (a dataset)", None, r"in\.h5: not a strata checkpoint or parameter file", code=2, src=None)
    out["checkpoint"][-2].make = out["checkpoint"][-1].make = lambda d: shutil.copy(fx.tiny, os.path.join(d, "in.h5"))

    def truncated(case_dir):
        with open(fx.mlp_ckpt, "rb") as f:
            data_ = f.read()
        with open(os.path.join(case_dir, "in.h5"), "wb") as f:
            f.write(data_[: len(data_) // 2])
    out["checkpoint"].append(Case("checkpoint: truncated (train --resume)", resume, 4, r"in\.h5: ", make=truncated))
    for cmd in (resume, [S, "inspect", "{C}/in.h5"]):
        out["checkpoint"].append(Case(f"checkpoint: damaged metadata found by fuzz_checkpoint ({cmd[1]})", cmd, 4,
                                      r"in\.h5: damaged file: HDF5 call H5Ovisit failed",
                                      make=lambda d: shutil.copy(os.path.join(reg, "checkpoint", "hdf5-leak-in-ovisit.h5"),
                                                                 os.path.join(d, "in.h5"))))
    out["checkpoint"].append(Case("checkpoint: empty (inspect)", [S, "inspect", "{C}/in.h5"], 4, r"in\.h5: not an HDF5 file",
                                  make=file_with("", "in.h5")))
    out["checkpoint"].append(Case("checkpoint: a directory (inspect)", [S, "inspect", "{C}"], 2, r"cannot open \(not a regular file\)"))
    out["checkpoint"].append(Case("checkpoint: a missing path (train --resume)", train + ["--resume", "{C}/none.h5"], 2,
                                  r"none\.h5: cannot open \(No such file"))
    out["checkpoint"].append(Case("checkpoint: written with another seed", resume + ["--train.seed", "7"], 4,
                                  r"in\.h5: cannot continue this run from it: it was written with train\.seed = 0",
                                  make=mutated(fx.mlp_ckpt, lambda f: None)))
    out["checkpoint"].append(Case("checkpoint: of another model", resume + ["--model.hidden", "16"], 4,
                                  r"in\.h5: cannot continue this run from it: it holds a different model",
                                  make=mutated(fx.mlp_ckpt, lambda f: None)))

    # --resume auto over a checkpoint directory
    def ckdir(entries):
        def make(case_dir):
            d = os.path.join(case_dir, "ck")
            os.makedirs(d)
            for name, content in entries.items():
                p = os.path.join(d, name)
                if content == "good":
                    shutil.copy(fx.mlp_ckpt, p)
                elif content == "heap-loop":
                    shutil.copy(HEAP_LOOP, p)
                elif content == "heap-crash":
                    shutil.copy(HEAP_CRASH, p)
                elif content == "no-format":
                    without_format(fx.mlp_ckpt, p)
                elif content == "bad":
                    shutil.copy(fx.mlp_ckpt, p)
                    with h5py.File(p, "r+") as f:
                        f["params/fc1/weight"][0, 0] = 9.0
                else:
                    with open(p, "w") as f:
                        f.write(content)
        return make
    auto = train + ["--train.max_steps", "3", "--resume", "auto", "--checkpoint.dir", "{C}/ck"]
    out["checkpoint"].append(Case("checkpoint: a stray ckpt-<23 digits>.h5 and a latest naming it are ignored (resume auto)",
                                  auto, 0, make=ckdir({"ckpt-000000002.h5": "good", "ckpt-99999999999999999999999.h5": "good",
                                                       "latest": "ckpt-99999999999999999999999.h5\n"})))
    out["checkpoint"].append(Case("checkpoint: the newest's metadata damaged under a checkpoint's name: passed over (resume auto)",
                                  auto, 0, make=ckdir({"ckpt-000000002.h5": "good", "ckpt-000000003.h5": "no-format",
                                                       "latest": "ckpt-000000003.h5\n"}),
                                  check_stdout=lambda s: "resumed from" in s and "ckpt-000000002.h5 at step 2" in s,
                                  allow_changes="the damaged checkpoint is renamed *.corrupt, by design"))
    for cmd in ("inspect", "eval"):
        argv = [S, "inspect", "{C}/ckpt-000000003.h5"] if cmd == "inspect" else \
            [S, "eval", "--checkpoint", "{C}/ckpt-000000003.h5", "--data", D]
        out["checkpoint"].append(Case(f"checkpoint: metadata damaged under a checkpoint's name: {cmd} exits 4", argv, 4,
                                      r"ckpt-000000003\.h5: damaged: its root attribute 'format' is missing",
                                      make=lambda d: without_format(fx.mlp_ckpt, os.path.join(d, "ckpt-000000003.h5"))))
    out["checkpoint"].append(Case("checkpoint: a new run into an earlier run's checkpoints (no --resume)", train, 2,
                                  r"checkpoint\.dir .*out/checkpoints: holds an earlier run's checkpoints \(the newest at "
                                  r"step 2\): --resume auto continues that run"))
    out["checkpoint"].append(Case("checkpoint: latest naming ../x is ignored (resume auto)", auto, 0,
                                  make=ckdir({"ckpt-000000002.h5": "good", "latest": "../x\n"})))
    # A checkpoint on which HDF5 1.10 loops for ever (found by fuzz_checkpoint): the read's
    # deadline (2 s here) ends the run with exit 4, the file renamed *.corrupt for the next attempt.
    fast = {"STRATA_TEST_READ_DEADLINE_S": "2"}
    out["checkpoint"].append(Case("checkpoint: HDF5 loops on it: deadline, renamed *.corrupt (resume auto)", auto, 4,
                                  r"ck/ckpt-000000003\.h5: reading it did not finish in 2 s: .*renamed it .*\.corrupt",
                                  env=fast, make=ckdir({"ckpt-000000003.h5": "heap-loop", "latest": "ckpt-000000003.h5\n"}),
                                  allow_changes="the damaged checkpoint is renamed *.corrupt, by design"))
    for cmd in ("inspect", "eval"):
        argv = [S, "inspect", "{C}/in.h5"] if cmd == "inspect" else [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D]
        out["checkpoint"].append(Case(f"checkpoint: HDF5 loops on it: {cmd} ends at the deadline", argv, 4,
                                      r"in\.h5: reading it did not finish in 2 s: its HDF5 structures are damaged",
                                      env=fast, make=lambda d: shutil.copy(HEAP_LOOP, os.path.join(d, "in.h5"))))
    # A checkpoint that crashes HDF5's reader: exit 4 naming it, no crash text, renamed *.corrupt.
    out["checkpoint"].append(Case("checkpoint: HDF5 crashes on it: exit 4, renamed *.corrupt (resume auto)", auto, 4,
                                  r"ck/ckpt-000000003\.h5: reading it crashed HDF5: .*renamed it .*\.corrupt",
                                  make=ckdir({"ckpt-000000003.h5": "heap-crash", "latest": "ckpt-000000003.h5\n"}),
                                  allow_changes="the damaged checkpoint is renamed *.corrupt, by design"))
    for cmd in ("inspect", "eval"):
        argv = [S, "inspect", "{C}/in.h5"] if cmd == "inspect" else [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D]
        out["checkpoint"].append(Case(f"checkpoint: HDF5 crashes on it: {cmd} exits 4", argv, 4,
                                      r"in\.h5: reading it crashed HDF5: its HDF5 structures are damaged$",
                                      make=lambda d: shutil.copy(HEAP_CRASH, os.path.join(d, "in.h5"))))
    out["checkpoint"].append(Case("checkpoint: none of them verifies (resume auto)", auto, 4,
                                  r"checkpoint\.dir .*ck: none of the 2 checkpoints verifies",
                                  make=ckdir({"ckpt-000000001.h5": "bad", "ckpt-000000002.h5": "bad", "latest": "ckpt-000000002.h5\n"}),
                                  allow_changes="damaged checkpoints are renamed *.corrupt, by design"))
    # sysfs takes no file, even from root, whom access(2) lets through (it said "0.0 MB free").
    out["checkpoint"].append(Case("checkpoint: checkpoint.dir where no file can be made",
                                  train + ["--checkpoint.dir", "/sys/kernel", "--checkpoint.every_steps", "1"], 2,
                                  r"checkpoint\.dir /sys/kernel: not writable"))
    out["checkpoint"].append(Case("checkpoint: checkpoint.dir is a file", train + ["--checkpoint.dir", "{C}/f", "--checkpoint.every_steps", "1"],
                                  2, r"checkpoint\.dir .*f: exists and is not a directory", make=file_with("x", "f")))

    # ---- parameter files: eval, generate, inspect ----
    evc = [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D]
    genc = [S, "generate", "--checkpoint", "{C}/in.h5", "--tokens", "2"]

    def pf(name, fn, pattern, code=4, cmd=None, src=None):
        out["params"].append(Case(f"params: {name}", cmd or evc, code, pattern, make=mutated(src or fx.mlp_params, fn)))
    pf("eval: missing tensor", lambda f: f.__delitem__("params/fc2/bias"), r"in\.h5: tensor /params/fc2/bias is missing")
    pf("eval: bad CRC exits 4 like inspect", lambda f: f["params/fc1/weight"].__setitem__((0, 0), 5.0),
       r"in\.h5: tensor /params/fc1/weight fails its checksum")
    pf("eval: NaN with a valid CRC", lambda f: replace_tensor(f, "params/fc2/weight", np.full((4, 8), np.inf)),
       r"in\.h5: tensor /params/fc2/weight holds 32 NaN/Inf values")
    pf("eval: unknown layer names the file and model_layers", set_attr("model_layers", "flatten\nfoo 3\nlinear 4\n"),
       r"in\.h5: root attribute model_layers: 'foo 3': unknown layer 'foo'")
    pf("eval: linear 1000000000", set_attr("model_layers", "flatten\nlinear 1000000000\nrelu\nlinear 4\n"),
       r"in\.h5: root attribute model_layers: 'linear 1000000000': 1000000000 is larger than 16777216")
    pf("eval: linear 10000000", set_attr("model_layers", "flatten\nlinear 10000000\nrelu\nlinear 4\n"),
       r"in\.h5: /params/fc1/bias has shape \(8,\); the model in the file \(model_layers\) needs \(10000000,\)")
    pf("eval: shape (20,) with a valid CRC", lambda f: replace_tensor(f, "params/fc2/bias", np.zeros(20)),
       r"in\.h5: /params/fc2/bias has shape \(20,\)")
    pf("eval: format missing", lambda f: f.attrs.__delitem__("format"), r"in\.h5: not a strata checkpoint or parameter file", code=2)
    pf("eval: format unknown", set_attr("format", "strata-other"), r"in\.h5: not a strata checkpoint or parameter file", code=2)
    pf("eval: format_version 2", set_attr("format_version", np.int64(2)), r"format_version 2 is not one this strata reads")
    pf("eval: classes 2^30", set_attr("classes", np.int64(1 << 30)), r"in\.h5: root attribute classes = 1073741824 is out of range")
    pf("eval: data of another shape", lambda f: None, r"samples .* do not fit the model in .*in\.h5", code=2,
       cmd=[S, "eval", "--checkpoint", "{C}/in.h5", "--data", fx.tokens])
    pf("generate: embedding 1000000000", set_attr("model_layers", "embedding 1000000000\nblock 1\nlayernorm\nlmhead\n"),
       r"in\.h5: root attribute model_layers: 'embedding 1000000000': 1000000000 is larger than 16777216", cmd=genc,
       src=fx.gpt_params)
    pf("generate: an MLP's parameters", lambda f: None, r"in\.h5: not a language model", code=2, cmd=genc)
    pf("generate: missing tensor", lambda f: f.__delitem__("params/layernorm1/weight"), r"in\.h5: tensor /params/layernorm1/weight is missing",
       cmd=genc, src=fx.gpt_params)
    pf("inspect: step -5", set_attr("step", np.int64(-5)), r"in\.h5: root attribute step = -5", cmd=[S, "inspect", "{C}/in.h5"])
    out["params"].append(Case("params: eval of a missing path", [S, "eval", "--checkpoint", "{C}/none.h5", "--data", D], 2,
                              r"none\.h5: cannot open \(No such file"))
    out["params"].append(Case("params: eval of a directory", [S, "eval", "--checkpoint", "{C}", "--data", D], 2,
                              r"cannot open \(not a regular file\)"))
    out["params"].append(Case("params: eval of a data file", [S, "eval", "--checkpoint", D, "--data", D], 2,
                              r"tiny\.h5: not a strata checkpoint or parameter file"))

    def json_ok(stdout):
        r = json.loads(stdout.strip().splitlines()[-1])
        return set(r) == {"accuracy", "loss", "samples", "precision"} and r["precision"] == "fp32"
    out["params"].append(Case("params: eval --json prints valid JSON", evc + ["--json"], 0,
                              make=mutated(fx.mlp_params, lambda f: None), check_stdout=json_ok))

    # ---- int8 files: strata quantize, and where an int8 file is handed (issue 19) ----
    def int8_file(case_dir):
        subprocess.run([S, "quantize", "--checkpoint", fx.mlp_params, "--out",
                        os.path.join(case_dir, "in.h5")], check=True, capture_output=True)

    def int8_mutated(fn):
        def make(case_dir):
            int8_file(case_dir)
            with h5py.File(os.path.join(case_dir, "in.h5"), "r+") as f:
                fn(f)
        return make
    qz = [S, "quantize", "--checkpoint", "{C}/in.h5", "--out", "{C}/q.h5"]
    for name, argv, code, pattern, make in [
            ("quantize of a data file", [S, "quantize", "--checkpoint", D, "--out", "{C}/q.h5"], 2,
             r"tiny\.h5: not a strata checkpoint or parameter file", None),
            ("quantize of an int8 file", qz, 2, r"in\.h5: already an int8 file", int8_file),
            ("quantize --calibrate without --data", qz + ["--calibrate", "4"], 2,
             r"--calibrate 4 needs --data", mutated(fx.mlp_params, lambda f: None)),
            ("quantize --calibrate with tokens for an mlp", qz + ["--calibrate", "4", "--data", fx.tokens], 2,
             r"--data .*: samples .* do not fit the model in .*in\.h5", mutated(fx.mlp_params, lambda f: None)),
            ("quantize --calibrate -1", qz + ["--calibrate", "-1"], 2, r"flag --calibrate: must be in",
             mutated(fx.mlp_params, lambda f: None)),
            ("quantize into a missing directory", [S, "quantize", "--checkpoint", "{C}/in.h5", "--out", "{C}/no/q.h5"], 2,
             r"q\.h5: cannot create the file", mutated(fx.mlp_params, lambda f: None)),
            ("an int8 file to train --resume", train + ["--train.max_steps", "3", "--resume", "{C}/in.h5"], 4,
             r"in\.h5: cannot continue this run from it: it is an int8 inference file", int8_file),
            ("an int8 file with a damaged int8 weight", [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D], 4,
             r"in\.h5: tensor /int8/fc1/weight/q fails its checksum",
             int8_mutated(lambda f: f["int8/fc1/weight/q"].__setitem__((0, 0), 99))),
            ("an int8 file whose products list is damaged", [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D], 4,
             r"in\.h5: root attribute int8_products: line 'fc1.weight' is not",
             int8_mutated(lambda f: f.attrs.__setitem__("int8_products", "fc1.weight\n"))),
            ("an int8 weight declared far larger than it is stored",
             [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D], 4,
             r"in\.h5: /int8/fc1/weight/q holds 0 bytes of data; its shape needs",
             int8_mutated(lambda f: (f.__delitem__("int8/fc1/weight/q"),
                                     f.create_dataset("int8/fc1/weight/q", shape=(8, 2**31 - 1), dtype=np.int8,
                                                      chunks=(1, 1 << 20))))),
            ("an int8 file with a subnormal activation scale",
             [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D], 4,
             r"in\.h5: /int8/fc1/weight/act_scale = .* is not 0 or a positive normal number",
             int8_mutated(lambda f: replace_tensor(f, "int8/fc1/weight/act_scale", [1e-45]))),
            ("eval --throughput --batch_size 0", [S, "eval", "--checkpoint", "{C}/in.h5", "--data", D,
                                                  "--throughput", "--batch_size", "0"], 2,
             r"flag --batch_size: must be in", int8_file)]:
        out["params"].append(Case(f"params: {name}", argv, code, pattern, make=make))

    def int8_json_ok(stdout):
        r = json.loads(stdout.strip().splitlines()[-1])
        return r["precision"] == "int8" and r["samples_per_s"] > 0 and r["latency_p99_ms"] >= r["latency_p50_ms"] > 0
    out["params"].append(Case("params: eval of an int8 file --throughput --json", [S, "eval", "--checkpoint", "{C}/in.h5",
                                                                                 "--data", D, "--json", "--throughput",
                                                                                 "--batch_size", "16"], 0,
                              make=int8_file, check_stdout=int8_json_ok))

    def huge_logits(f):
        replace_tensor(f, "params/fc2/weight", np.full((4, 8), 3e38))
        replace_tensor(f, "params/fc2/bias", np.array([3e38, -3e38, 3e38, -3e38]))

    def json_null_loss(stdout):
        r = json.loads(stdout.strip().splitlines()[-1])
        return r["loss"] is None
    out["params"].append(Case("params: eval --json writes null for a non-finite loss", evc + ["--json"], 0,
                              make=mutated(fx.mlp_params, huge_logits), check_stdout=json_null_loss))

    # ---- strata export and train.init_from (Hugging Face safetensors, llm.c; issue 31) ----
    def exported(fmt, fn=None, name="hf"):
        """make(): the GPT fixture exported (--format fmt; once, then copied) to CASE/NAME, then
        fn(path) on it. The export is kept beside the fixtures, not among them: cases running
        meanwhile check the fixtures for changes and temporary files."""
        def make(case_dir):
            exports = os.path.join(fx.work, "exports")
            os.makedirs(exports, exist_ok=True)
            path = os.path.join(case_dir, name)
            done = os.path.join(exports, f"export-{fmt}-{os.stat(fx.gpt_params).st_mtime_ns}")
            with EXPORT_LOCK:
                if not os.path.exists(done):
                    subprocess.run([S, "export", "--checkpoint", fx.gpt_params, "--format", fmt, "--out",
                                    done + ".tmp"], check=True, capture_output=True)
                    os.rename(done + ".tmp", done)
            (shutil.copytree if fmt == "hf" else shutil.copy)(done, path)
            if fn:
                fn(os.path.join(path, "model.safetensors") if fmt == "hf" else path)
        return make

    def st_rewrite(edit):
        """fn(): rewrites a safetensors file: edit(header dict, buffer) -> (header text, buffer)."""
        def fn(path):
            blob = open(path, "rb").read()
            n = int.from_bytes(blob[:8], "little")
            text, buf = edit(json.loads(blob[8:8 + n]), bytearray(blob[8 + n:]))
            raw = text.encode() if isinstance(text, str) else text
            with open(path, "wb") as f:
                f.write(len(raw).to_bytes(8, "little") + raw + bytes(buf))
        return fn

    def shift(name, by):
        def edit(h, buf):
            h[name]["data_offsets"] = [o + by for o in h[name]["data_offsets"]]
            return json.dumps(h), buf
        return edit

    def without(name):
        def edit(h, buf):
            b, e = h.pop(name)["data_offsets"]
            for v in h.values():
                if "data_offsets" in v and v["data_offsets"][0] >= e:
                    v["data_offsets"] = [o - (e - b) for o in v["data_offsets"]]
            return json.dumps(h), buf[:b] + buf[e:]
        return edit

    def set_in(key, value):
        def edit(h, buf):
            h["wte.weight"][key] = value
            return json.dumps(h), buf
        return edit

    def patch_bytes(offset, data=None, truncate=0):
        def fn(path):
            blob = bytearray(open(path, "rb").read())
            if data is not None:
                blob[offset:offset + len(data)] = data
            with open(path, "wb") as f:
                f.write(blob[:len(blob) - truncate])
        return fn

    def set_activation(name):
        """fn(): config.json beside model.safetensors says activation_function = name."""
        def fn(path):
            cfg_path = os.path.join(os.path.dirname(path), "config.json")
            cfg = json.load(open(cfg_path))
            cfg["activation_function"] = name
            json.dump(cfg, open(cfg_path, "w"))
        return fn

    def truncate_last(path):
        st_rewrite(lambda h, buf: (json.dumps(h), buf[:-4]))(path)

    init = gtrain + ["--train.init_from"]
    for name, argv, code, pattern, make in [
            ("init_from a missing path", init + ["{C}/none"], 2, r"train\.init_from: .*none: cannot open \(No such file", None),
            ("init_from a directory without safetensors", init + ["{C}"], 2,
             r"holds neither model\.safetensors nor model\.safetensors\.index\.json", None),
            ("safetensors header length past the end", init + ["{C}/hf"], 4,
             r"model\.safetensors: header length 1099511627776 .* runs past the end of the file",
             exported("hf", patch_bytes(0, (1 << 40).to_bytes(8, "little")))),
            ("safetensors header that is not JSON", init + ["{C}/hf"], 4,
             r"model\.safetensors: header: bad JSON at line 1, column 13 \(byte 12\): unexpected end; expected ']'",
             exported("hf", st_rewrite(lambda h, buf: ('{"a": [1, 2 ', buf)))),
            ("safetensors header with a duplicate key", init + ["{C}/hf"], 4,
             r"model\.safetensors: header: bad JSON at line \d+, column \d+ \(byte \d+\): duplicate key \"wpe\.weight\"",
             exported("hf", st_rewrite(lambda h, buf: (json.dumps(h)[:-1] + ', "wpe.weight": ' +
                                                        json.dumps(h["wpe.weight"]) + "}", buf)))),
            ("safetensors offsets overlapping", init + ["{C}/hf"], 4,
             r"model\.safetensors: tensor h\.0\.ln_1\.bias starts at buffer offset \d+, where the previous tensor ends at",
             exported("hf", st_rewrite(shift("h.0.ln_1.bias", -4)))),
            ("safetensors offsets past the buffer", init + ["{C}/hf"], 4,
             r"model\.safetensors: the tensors cover \d+ bytes of the buffer, which holds \d+",
             exported("hf", truncate_last)),
            ("safetensors offsets not matching the shape", init + ["{C}/hf"], 4,
             r"model\.safetensors: tensor wte\.weight: data_offsets \[0, 8\] hold 8 bytes; dtype F32 and shape",
             exported("hf", st_rewrite(set_in("data_offsets", [0, 8])))),
            ("safetensors unknown dtype", init + ["{C}/hf"], 4,
             r"model\.safetensors: tensor wte\.weight has an unknown dtype \"F33\"",
             exported("hf", st_rewrite(set_in("dtype", "F33")))),
            ("safetensors integer dtype", init + ["{C}/hf"], 4,
             r"model\.safetensors: tensor wte\.weight: dtype I32 is not a floating-point type",
             exported("hf", st_rewrite(set_in("dtype", "I32")))),
            ("init_from a shape mismatch", init + ["{C}/hf", "--model.context", "4"], 4,
             r"model\.safetensors: tensor wpe\.weight has shape \(8, 8\); the model needs \(4, 8\)",
             exported("hf")),
            ("init_from more blocks than the file", init + ["{C}/hf", "--model.layers", "2"], 4,
             r"hf: tensor h\.1\.ln_1\.weight is missing \(the model needs shape \(8,\)\)", exported("hf")),
            ("init_from a missing tensor", init + ["{C}/hf"], 4, r"hf: tensor ln_f\.bias is missing",
             exported("hf", st_rewrite(without("ln_f.bias")))),
            ("init_from an extra tensor", init + ["{C}/hf"], 4,
             r"model\.safetensors: holds tensor h\.7\.ln_1\.bias, which is not one of the model's \(1 blocks\)",
             exported("hf", st_rewrite(lambda h, buf: (json.dumps(dict(h, **{"h.7.ln_1.bias": dict(
                 h["h.0.ln_1.bias"], data_offsets=[len(buf), len(buf) + 32])})), buf + bytes(32))))),
            ("init_from heads differing from config.json", init + ["{C}/hf", "--model.heads", "2"], 4,
             r"config\.json: n_head = 1; the model has 2 heads", exported("hf")),
            ("init_from strata's own parameter file", init + ["{C}/model.h5"], 2,
             r"model\.h5: an HDF5 file \(strata's parameter files and checkpoints are\): continue a run from it with --resume",
             copy_as(fx.gpt_params, "model.h5")),
            ("llm.c file with a wrong magic", init + ["{C}/m.bin"], 4,
             r"m\.bin: neither a Hugging Face GPT-2 directory .*its first int32 is 1, not llm\.c's magic 20240326",
             exported("llmc", patch_bytes(0, (1).to_bytes(4, "little")), "m.bin")),
            ("llm.c file with version 4", init + ["{C}/m.bin"], 4,
             r"m\.bin: version 4 is not one strata reads", exported("llmc", patch_bytes(4, (4).to_bytes(4, "little")), "m.bin")),
            ("llm.c file cut short", init + ["{C}/m.bin"], 4,
             r"m\.bin: \d+ bytes; its header \(version 3, maxT 8, Vp 256, L 1, C 8\) needs \d+",
             exported("llmc", patch_bytes(0, None, 4), "m.bin")),
            ("llm.c file of another width", init + ["{C}/m.bin", "--model.dim", "16"], 4,
             r"m\.bin: header C \(model\.dim\) = 8; the model has 16", exported("llmc", None, "m.bin")),
            # The GELU (model.gelu): the file's (config.json's activation_function; llm.c: always
            # tanh) must be the model's, each named.
            ("init_from an erf export into model.gelu = tanh", init + ["{C}/hf", "--model.gelu", "tanh"], 4,
             r'config\.json: activation_function = "gelu" is the erf GELU; the model\'s is tanh \(model\.gelu = "tanh"\)',
             exported("hf")),
            ("init_from gelu_new into model.gelu = erf", init + ["{C}/hf"], 4,
             r'config\.json: activation_function = "gelu_new" is the tanh GELU; the model\'s is erf \(model\.gelu = "erf"\)',
             exported("hf", set_activation("gelu_new"))),
            ("init_from an activation_function that is not a GELU", init + ["{C}/hf"], 4,
             r'config\.json: activation_function = "relu" is not a GELU strata runs', exported("hf", set_activation("relu"))),
            ("init_from an llm.c file into model.gelu = erf", init + ["{C}/m.bin"], 4,
             r"m\.bin: an llm\.c model, trained with the tanh GELU; the model's is erf \(model\.gelu = \"erf\"\)",
             exported("llmc", None, "m.bin")),
            ("model.gelu not erf or tanh", gtrain + ["--model.gelu", "approx"], 2, r"model\.gelu.*erf.*tanh", None),
            ("init_from for an mlp", train + ["--train.init_from", "{C}/hf"], 2,
             r"train\.init_from: needs model\.type = \"gpt\"", exported("hf")),
            ("export to an unknown format", [S, "export", "--checkpoint", fx.gpt_params, "--format", "onnx", "--out", "{C}/x"],
             2, r"flag --format: onnx not in \{hf,llmc\}", None),
            ("export of an mlp", [S, "export", "--checkpoint", fx.mlp_params, "--format", "hf", "--out", "{C}/x"], 2,
             r"mlp/model\.h5: not a GPT-2 model", None),
            ("export of an int8 file", [S, "export", "--checkpoint", "{C}/in.h5", "--format", "llmc", "--out", "{C}/x"], 2,
             r"in\.h5: an int8 file \(strata quantize\) cannot be exported", int8_file),
            ("export with a bad --max_shard_size", [S, "export", "--checkpoint", fx.gpt_params, "--format", "hf", "--out",
                                                    "{C}/x", "--max_shard_size", "5XB"], 2,
             r"flag --max_shard_size: '5XB' is not a size", None),
            ("export of a tokenizer whose vocabulary changed", [S, "export", "--checkpoint", "{C}/in.h5", "--format", "hf",
                                                                "--out", "{C}/x"], 2,
             r"encoder\.json: SHA-256 [0-9a-f]{64} is not the 0{64} recorded in .*in\.h5",
             lambda d: (open(os.path.join(d, "encoder.json"), "w").write("{}"),
                        open(os.path.join(d, "vocab.bpe"), "w").write("#version: 0.2\n"),
                        mutated(fx.gpt_params, lambda f: f.attrs.update({
                            "tokenizer": "gpt2", "tokenizer_vocab": d, "tokenizer_sha256_encoder.json": "0" * 64,
                            "tokenizer_sha256_vocab.bpe": "0" * 64}))(d)))]:
        out["params"].append(Case(f"params: {name}", argv, code, pattern, make=make,
                                  earlier_checkpoints="--train.init_from" not in argv))

    # ---- environment variables ----
    def envc(name, env, pattern, code=2, argv=None, marker=False):
        c = Case(f"env: {name}", argv or train, code, pattern, env=env,
                 earlier_checkpoints="STRATA_TEST_HANG" not in env)
        out["env"].append(c)
    for v in ("5000", "0", "-1", "abc", "1e3", "99999999999999999999"):
        envc(f"SLURM_CPUS_PER_TASK={v}", {"SLURM_CPUS_PER_TASK": v}, r"environment variable SLURM_CPUS_PER_TASK=")
    envc("SLURM_CPUS_PER_TASK=5000 with --threads 1", {"SLURM_CPUS_PER_TASK": "5000"}, "", 0, train + ["--threads", "1"])
    envc("SLURM_CPUS_PER_TASK=5000 for eval", {"SLURM_CPUS_PER_TASK": "5000"}, r"SLURM_CPUS_PER_TASK=5000",
         argv=[S, "eval", "--checkpoint", fx.mlp_params, "--data", D])
    for v in ("abc", "nan", "inf", "-1", "0x10"):
        envc(f"STRATA_JOB_END_TIME={v}", {"STRATA_JOB_END_TIME": v}, r"environment variable STRATA_JOB_END_TIME=")
    envc("STRATA_JOB_END_TIME an hour ago", {"STRATA_JOB_END_TIME": str(int(time.time()) - 3600)},
         r"STRATA_JOB_END_TIME=\d+: the job's end time is \d+ s in the past")
    for v in ("1'; touch %s; echo '" % MARKER, "$(touch %s)" % MARKER, "`touch %s`" % MARKER, "12 34", "-1", "abc"):
        envc(f"SLURM_JOB_ID={v!r}", {"SLURM_JOB_ID": v}, r"environment variable SLURM_JOB_ID=.*not a Slurm job id")
    envc("SLURM_ARRAY_JOB_ID with a quote", {"SLURM_ARRAY_JOB_ID": "1'x", "SLURM_ARRAY_TASK_ID": "2"},
         r"SLURM_ARRAY_JOB_ID='1'x': not a Slurm job id")
    envc("SLURM_RESTART_COUNT=abc", {"SLURM_RESTART_COUNT": "abc"}, r"SLURM_RESTART_COUNT='abc': expected an integer")
    envc("SLURM_RESTART_COUNT=-1", {"SLURM_RESTART_COUNT": "-1"}, r"SLURM_RESTART_COUNT=-1: must be in")
    envc("SLURM_LOCALID=abc", {"SLURM_LOCALID": "abc"}, r"SLURM_LOCALID='abc'")
    envc("OMPI_COMM_WORLD_LOCAL_RANK=-3", {"OMPI_COMM_WORLD_LOCAL_RANK": "-3"}, r"OMPI_COMM_WORLD_LOCAL_RANK=-3")
    for v in ("-1", "abc", "99999999999999999999"):
        envc(f"STRATA_DATA_CACHE_MB={v}", {"STRATA_DATA_CACHE_MB": v}, r"STRATA_DATA_CACHE_MB=")
    envc("STRATA_TEST_HANG garbage", {"STRATA_TEST_HANG": "x:y"}, r"STRATA_TEST_HANG: 'x:y' is not RANK:STEP")
    envc("STRATA_TEST_HANG NaN seconds", {"STRATA_TEST_HANG": "0:5:nan"}, r"STRATA_TEST_HANG: '0:5:nan'")
    envc("a valid SLURM_JOB_ID whose squeue fails (no cluster) warns and runs", {"SLURM_JOB_ID": "12345",
         "SLURM_CONF": "/nonexistent/slurm.conf"}, "", 0)
    for name in ("STRATA_ATTEMPT_START", "STRATA_STEP_START"):  # train.sbatch's clocks
        for v in ("abc", "nan", "-5", "1e30"):
            envc(f"{name}={v}", {name: v}, rf"environment variable {name}=")

    memory_cases(fx, out["memory"], train)

    # ---- the job script's settings (slurm/train.sbatch, checked before it runs anything) ----
    sbatch = [shutil.which("bash") or "/bin/bash", SBATCH]
    for name in ("STRATA_MAX_NO_PROGRESS", "STRATA_MAX_RESTARTS", "STRATA_MIN_NODES", "STRATA_HEALTH_TIMEOUT"):
        for v in ("abc", "-1", "1e3", " 3", "9999999", "1; touch %s" % MARKER, "$(touch %s)" % MARKER):
            out["sbatch"].append(Case(
                f"sbatch: {name}={v!r}", sbatch, 2, rf"^train\.sbatch: error: {name}=.*expected an integer",
                env={name: v, "CONFIG": "configs/fmnist_mlp.toml", "STRATA": S},
                error_line_prefix="train.sbatch: error: "))
    return out


# ----------------------------------------------------------------------------- memory

CGROUP_V1 = "/sys/fs/cgroup/memory"
CGROUP_V2 = "/sys/fs/cgroup"


def memory_cgroup(limit_bytes):
    """A memory cgroup of its own with `limit_bytes` (v1 memory.limit_in_bytes, or v2
    memory.max), and a preexec function that moves a child into it; (None, reason) where this
    machine does not let the test make one."""
    for root, limit_file in ((CGROUP_V1, "memory.limit_in_bytes"), (CGROUP_V2, "memory.max")):
        if not os.path.exists(os.path.join(root, limit_file)) and not os.path.exists(
                os.path.join(root, "cgroup.controllers")):
            continue
        if root == CGROUP_V2 and "memory" not in open(os.path.join(root, "cgroup.controllers")).read():
            continue
        d = os.path.join(root, f"strata-badinput-{os.getpid()}")
        try:
            os.makedirs(d, exist_ok=True)
            atexit.register(lambda: os.path.isdir(d) and os.rmdir(d))  # empty once its cases ended
            with open(os.path.join(d, limit_file), "w") as f:
                f.write(str(limit_bytes))
        except OSError as e:
            return None, f"cannot make a memory cgroup under {root}: {e.strerror}"

        def join():
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        return (d, join), ""
    return None, "no memory cgroup controller is mounted (v1 or v2)"


def memory_cases(fx, out, train):
    """A job's memory limits (cgroup, ulimit -v, ulimit -d) bound the memory check; and an
    allocation that fails past the check is an out-of-memory error (exit 7) naming the rank,
    the size and what was being allocated, in every command."""
    S, D = fx.strata, fx.tiny
    mlp = [S, "train", "--data.path", D, "--train.batch_size", "8", "--train.max_steps", "1",
           "--output.dir", "{OUT}", "--quiet"]
    big = mlp + ["--model.hidden", "3000000"]  # 2.2 GiB with gradients and state: fits the node
    prlimit = shutil.which("prlimit")
    if prlimit:
        out.append(Case("memory: ulimit -v 4 GiB bounds the check (RLIMIT_AS)",
                        [prlimit, "--as=4294967296", "--"] + mlp + ["--model.hidden", "8000000"], 2,
                        r"needs .*; this process's ulimit -v \(RLIMIT_AS 4\.0 GiB, .* of address space in use\) leaves"))
        out.append(Case("memory: ulimit -d 2 GiB bounds the check (RLIMIT_DATA)",
                        [prlimit, "--data=2147483648", "--"] + mlp + ["--model.hidden", "8000000"], 2,
                        r"needs .*; this process's ulimit -d \(RLIMIT_DATA 2\.0 GiB, .* of data segment in use\) leaves"))
    else:
        print("skipped: memory: ulimit cases: no prlimit (util-linux) on this machine")
    cg, why = memory_cgroup(1 << 30)
    if cg:
        out.append(Case("memory: a job's 1 GiB cgroup limit bounds the check (Slurm --mem)", big, 2,
                        r"needs 2\.\d GiB; the job's memory limit \(its cgroup's, 1\.0 GiB; .* in use\) leaves",
                        preexec=cg[1]))
    else:
        print(f"skipped: memory: a cgroup limit: {why}")
    # Memory checkpoints (checkpoint.memory_every): the directory must be creatable, and two
    # generations of the parts must fit its file system (a 1 MiB tmpfs in a mount namespace of
    # the case's own) and the node's memory.
    mem = mlp + ["--checkpoint.memory_every", "1", "--checkpoint.memory_dir"]
    out.append(Case("memory: checkpoint.memory_dir under a regular file", mem + [D + "/shm"], 2,
                    r"checkpoint\.memory_dir .*/shm: cannot create it", earlier_checkpoints=False))
    out.append(Case("memory: checkpoint.memory_budget without memory_every",
                    mlp + ["--checkpoint.memory_budget", "0.03"], 2,
                    r"checkpoint\.memory_budget = 0\.03 needs checkpoint\.memory_every"))
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--mount", "true"], capture_output=True).returncode == 0:
        out.append(Case("memory: memory checkpoints larger than their tmpfs",
                        [unshare, "--mount", "sh", "-c", 'mount -t tmpfs -o size=1m none /mnt && exec "$@"',
                         "sh"] + mem + ["/mnt/strata", "--model.hidden", "4096"], 2,
                        r"checkpoint\.memory_dir /mnt/strata on node .*: memory checkpoints need [0-9.]+ MiB "
                        r"there .*, its file system has [0-9.]+ [KM]iB free$", earlier_checkpoints=False))
    else:
        print("skipped: memory: checkpoints larger than their tmpfs: cannot mount one (unshare --mount)")
    # Past the check: the test hook fails every allocation of at least N bytes.
    def oom(name, argv, n, what, scope=""):
        out.append(Case(f"memory: out of memory past the check: {name}", argv, 7,
                        rf"^strata: error: rank 0 \(.*\): out of memory: could not allocate [0-9.]+ [KMG]iB "
                        rf"while {what} \(.*; exit 7\)$",
                        env={"STRATA_TEST_FAIL_ALLOCATION": f"{n}{':' + scope if scope else ''}"}))
    oom("train (the model's buffers)", mlp + ["--model.hidden", "4096", "4096"], 16 << 20,
        r"building the model")
    oom("train --resume of a large checkpoint", mlp + ["--model.hidden", "3600", "3600", "--train.max_steps", "2",
        "--resume", fx.path("big", "ckpt.h5")], 16 << 20, r"reading the checkpoint to resume from", "checkpoint")
    oom("eval", [S, "eval", "--checkpoint", fx.mlp_params, "--data", D], 4096, r"running strata eval")
    oom("generate", [S, "generate", "--checkpoint", fx.gpt_params, "--tokens", "5"], 4096,
        r"running strata generate")
    oom("quantize", [S, "quantize", "--checkpoint", fx.mlp_params, "--out", "{C}/q.h5"], 4096,
        r"running strata quantize")
    oom("prepare text", [S, "prepare", "text", "--input", fx.path("text.txt"), "--out", "{C}/t.h5"], 4096,
        r"running strata prepare text")


# ----------------------------------------------------------------------------- the runner

def snapshot(case_dir, fixtures):
    """Each file's state: the case's own files hashed; the shared fixtures (150 MB, hashing them
    was most of a case's time) by stat, whose ctime any write or metadata change moves."""
    state = {}
    for d, hashed in ((case_dir, True), (fixtures, False)):
        for root, _, files in os.walk(d):
            for n in files:
                p = os.path.join(root, n)
                try:
                    st = os.stat(p)
                    if hashed:
                        with open(p, "rb") as f:
                            state[p] = (st.st_size, st.st_mtime_ns, hashlib.sha256(f.read()).hexdigest())
                    else:
                        state[p] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                except OSError:
                    pass
    return state


def prepare_output(out, fx, checkpoints=True):
    """A run directory with files from an earlier run: none of them may change. Without its
    checkpoints for a new run that must work: a new run refuses a directory that has them."""
    os.makedirs(out)
    shutil.copy(fx.mlp_params, os.path.join(out, "model.h5"))
    if checkpoints:
        os.makedirs(os.path.join(out, "checkpoints"))
        shutil.copy(fx.mlp_ckpt, os.path.join(out, "checkpoints", "ckpt-000000002.h5"))
        with open(os.path.join(out, "checkpoints", "latest"), "w") as f:
            f.write("ckpt-000000002.h5\n")
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.write('{"earlier": "line"}\n')


def run_case(case, fx, work):
    # Unique per case ('inf' and '-inf' read alike): cases run side by side.
    slug = re.sub(r"[^A-Za-z0-9]+", "-", case.name).strip("-")[:80] + "-" + \
        hashlib.sha1(case.name.encode()).hexdigest()[:8]
    case_dir = os.path.join(work, "cases", slug)
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(case_dir)
    out = os.path.join(case_dir, "out")
    prepare_output(out, fx, checkpoints=case.earlier_checkpoints and (case.code != 0 or "--resume" in case.argv))
    if case.make:
        case.make(case_dir)
    if os.path.exists(MARKER):
        os.remove(MARKER)
    argv = [a.replace("{OUT}", out).replace("{C}", case_dir) for a in case.argv]
    before = snapshot(case_dir, fx.base)
    try:
        p = subprocess.run(argv, env=dict(ENV, **case.env), capture_output=True, text=True, timeout=60,
                           errors="replace", preexec_fn=case.preexec)
    except subprocess.TimeoutExpired:
        return "did not end within 60 s"
    problems = []
    errors = [l for l in p.stderr.splitlines() if l.startswith(case.error_line_prefix)]
    if p.returncode != case.code:
        problems.append(f"exit {p.returncode}, expected {case.code}")
    if case.code == 0:
        if errors:
            problems.append(f"error line(s) in a run that must work: {errors[:2]}")
        if case.check_stdout:
            try:
                if not case.check_stdout(p.stdout):
                    problems.append("stdout check failed")
            except Exception as e:  # noqa: BLE001 (a parse failure is the finding)
                problems.append(f"stdout check failed: {e}")
    else:
        if len(errors) != 1:
            problems.append(f"{len(errors)} error lines, expected 1")
        elif case.pattern and not re.search(case.pattern, errors[0]):
            problems.append(f"error line does not match /{case.pattern}/")
    if CRASH_TEXT.search(p.stdout + p.stderr):
        problems.append(f"crash text: {CRASH_TEXT.search(p.stdout + p.stderr).group(0)!r}")
    if os.path.exists(MARKER):
        problems.append("a shell ran: the marker file was created")
    after = snapshot(case_dir, fx.base)
    changed = [k for k, v in before.items() if after.get(k) != v]
    if changed and not (case.allow_changes and all(k.startswith(os.path.join(case_dir, "ck")) for k in changed)):
        if case.code != 0 or any(k.startswith(fx.base) for k in changed):
            problems.append(f"changed: {[os.path.relpath(k, work) for k in changed][:3]}")
    leftovers = [k for k in after if ".tmp." in os.path.basename(k)]
    if leftovers:
        problems.append(f"temporary files left: {leftovers[:2]}")
    if problems:
        tail = "\n".join("    | " + l for l in p.stderr.splitlines()[-6:])
        return "; ".join(problems) + ("\n" + tail if tail else "")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cls")
    ap.add_argument("--strata", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--jobs", type=int, default=3,
                    help="cases run at once (a case mostly waits for MPI's start-up, not the CPU); "
                         "the memory class and the cases that look for a shell's marker run alone")
    a = ap.parse_args()
    global MARKER  # one per class: ctest runs classes side by side
    MARKER = f"/tmp/strata-badinput-marker-{a.cls}"
    strata = os.path.abspath(a.strata)
    work = os.path.abspath(os.path.join(a.work, a.cls))
    fx = Fixtures(strata, work)  # per class: ctest runs classes side by side
    table = cases(fx)
    classes = list(table) if a.cls == "all" else [a.cls]
    if any(c not in table for c in classes):
        sys.exit(f"unknown class {a.cls}: one of {', '.join(table)}, all")
    if a.list:
        for c in classes:
            for case in table[c]:
                print(f"{c}: {case.name}")
        print(f"{sum(len(table[c]) for c in classes)} cases")
        return
    failed, total = [], 0
    for c in classes:
        t0 = time.monotonic()
        n = 0
        chosen = [case for case in table[c] if not a.only or a.only in case.name]
        n = len(chosen)

        def alone(case):  # the marker is one file: a case that may create it runs by itself
            return c == "memory" or MARKER in " ".join(map(str, case.argv)) or \
                any(MARKER in str(v) for v in case.env.values())

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
            pooled = {id(case): pool.submit(run_case, case, fx, work)
                      for case in chosen if not alone(case)}
            for case in chosen:  # reported in the table's order, each as soon as it is known
                why = pooled[id(case)].result() if id(case) in pooled else None
                if id(case) not in pooled:
                    pool.shutdown(wait=True)  # nothing else runs beside it
                    why = run_case(case, fx, work)
                print(f"{'ok  ' if why is None else 'FAIL'} {case.name}" + ("" if why is None else f": {why}"), flush=True)
                if why is not None:
                    failed.append(case.name)
        total += n
        print(f"== {c}: {n} cases, {n - sum(1 for f in failed if f.startswith(c))} passed, "
              f"{time.monotonic() - t0:.0f} s")
    print(f"{total - len(failed)} of {total} cases passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
