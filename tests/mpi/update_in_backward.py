#!/usr/bin/python3
"""On one rank without clipping, strata applies the optimizer to each layer's parameters as
soon as backward has produced their gradients. That must be bitwise the same as one update
after backward, which strata uses when clipping is on (a clip threshold of 1e9 never clips).

Usage: update_in_backward.py STRATA DATA.h5 WORKDIR
"""
import os
import subprocess
import sys

from common import parameters

strata, data, work = sys.argv[1:4]
out = {}
for optimizer in ("sgd", "adamw"):
    for clip in ("0", "1e9"):
        d = os.path.join(work, f"update-{optimizer}-{clip}")
        os.makedirs(d, exist_ok=True)
        subprocess.run([strata, "train", "--data.path", data, "--model.type", "cnn",
                        "--model.channels", "4", "8", "--model.hidden", "16",
                        "--train.optimizer", optimizer, "--train.lr", "0.01",
                        "--train.max_steps", "40", "--train.grad_clip", clip,
                        "--output.dir", d, "--quiet"], check=True, stdout=subprocess.DEVNULL)
        out[optimizer, clip] = parameters(os.path.join(d, "model.h5"))
ok = True
for optimizer in ("sgd", "adamw"):
    a, b = out[optimizer, "0"], out[optimizer, "1e9"]
    same = a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    print(f"{optimizer}: update during backward == update after backward, bitwise: {same}")
    ok &= same
sys.exit(0 if ok else 1)
