#!/usr/bin/python3
"""PyTorch reference data for strata's parity tests (tests/unit/test_torch_parity.cpp).

Usage: torch_reference.py OUT_DIR   -> writes OUT_DIR/mlp.h5 and OUT_DIR/cnn.h5

For each model, built as the torch.nn.Sequential that strata's layer spec describes and
initialised by PyTorch's own default init under a fixed seed, the file holds:
  attrs: spec (layer specs joined by newlines), batch, classes, torch_version,
         min_margin, draws (see "Well-conditioned batches")
  init/<name>     initial parameters under strata's global names ("conv1.weight", "fc2.bias")
  x, y            one batch (B,1,28,28) float32 in [0,1), labels int32
  logits, loss    forward on that batch; loss is the mean cross-entropy (float64)
  grad/<name>     every parameter's gradient after loss.backward()
  bf16/logits, bf16/loss, bf16/grad/<name>
                  the same under torch.autocast("cpu", dtype=torch.bfloat16) (bf16 GEMMs and
                  convolutions, fp32 parameters and gradients): train.precision = "bf16"'s
                  reference
  <opt>/x, <opt>/y        20 batches (20,B,1,28,28), (20,B)
  <opt>/loss              the 20 losses, each computed before its step's update
  <opt>/final/<name>      the parameters after the 20 steps
  <opt> attrs: the optimizer's hyperparameters; min_margin, draws per step
with <opt> = sgd for both models and also adamw for the MLP.

Well-conditioned batches. The gradient of a ReLU network is discontinuous where a ReLU input is
0 or the two largest entries of a max-pool window are equal. Within fp32 rounding of such a
point, strata and torch may take different sides, both correctly, and the gradient of that one
unit (a whole row of a weight gradient) then differs by O(1) of its size: with B = 16 and
~10^5 pooling windows, a gap below 1e-7 occurs in about one CNN batch in seven. That would make
the comparison a coin toss rather than a measurement, so every batch (the single one and each
training step's, with the parameters of that step) is redrawn until, in a float64 forward, all
those gaps are at least MARGIN: ~10x the activation differences between the two fp32
computations (<= ~3e-7 absolute, activations being O(1)), yet small enough that a CNN batch
qualifies in ~6 draws (an MLP one almost always at once).

Everything is float32 except the losses, with one thread so the numbers do not depend on the
machine's core count. There is deliberately no fallback: without torch this script fails, and so
does the CTest fixture that runs it.
"""
import copy
import math
import os
import sys

import h5py
import numpy as np
import torch

B = 16
CLASSES = 10
STEPS = 20

MLP_SPEC = ["flatten", "linear 256", "relu", "linear 128", "relu", "linear 10"]
CNN_SPEC = ["conv 32 3 1 1", "relu", "maxpool 2", "conv 64 3 1 1", "relu", "maxpool 2",
            "flatten", "linear 128", "relu", "linear 10"]

MARGIN = 2e-6  # see "Well-conditioned batches" above
MAX_DRAWS = 2000

SGD = dict(lr=0.05, momentum=0.9, weight_decay=1e-4)
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def build(spec, in_shape=(1, 28, 28)):
    """The Sequential for a strata spec, and strata's global name of each torch parameter."""
    layers, names = [], {}
    counts = {}
    c, h, w = in_shape
    flat = None
    for i, s in enumerate(spec):
        k, *a = s.split()
        a = [int(v) for v in a]
        if k == "linear":
            layers.append(torch.nn.Linear(flat, a[0]))
            flat = a[0]
        elif k == "conv":
            oc, ks = a[0], a[1]
            st = a[2] if len(a) > 2 else 1
            pad = a[3] if len(a) > 3 else 0
            layers.append(torch.nn.Conv2d(c, oc, ks, stride=st, padding=pad))
            c, h, w = oc, (h + 2 * pad - ks) // st + 1, (w + 2 * pad - ks) // st + 1
        elif k == "maxpool":
            ks = a[0]
            st = a[1] if len(a) > 1 else ks
            layers.append(torch.nn.MaxPool2d(ks, st))
            h, w = (h - ks) // st + 1, (w - ks) // st + 1
        elif k == "relu":
            layers.append(torch.nn.ReLU())
        elif k == "flatten":
            layers.append(torch.nn.Flatten())
            flat = c * h * w
        else:
            raise SystemExit(f"torch_reference.py: no torch equivalent for layer '{s}'")
        # strata names parameterised layers kind + per-kind counter: conv1, conv2, fc1, ...
        short = {"linear": "fc"}.get(k, k)
        counts[short] = counts.get(short, 0) + 1
        for pname, _ in layers[-1].named_parameters():
            names[f"{i}.{pname}"] = f"{short}{counts[short]}.{pname}"
    model = torch.nn.Sequential(*layers)
    return model, {names[n]: p for n, p in model.named_parameters()}


def batch(gen, protos):
    """B random labels and inputs in [0,1): 3/4 of a fixed random binary prototype image of the
    label's class plus 1/4 uniform noise, so the 20 steps learn something and the losses fall
    (with labels unrelated to the inputs they would barely move and exercise less of training)."""
    y = torch.randint(0, CLASSES, (B,), generator=gen)
    x = 0.25 * torch.rand((B, 1, 28, 28), generator=gen) + 0.75 * protos[y]
    return x, y


def min_margin(mods, x):
    """Distance of batch x from the gradient's discontinuities, in a float64 forward through
    mods (float64 copies of the model's layers): the smallest |ReLU input| and, over max-pool
    windows that pass gradient (largest entry > 0), the smallest gap between the two largest
    entries (after a ReLU this also covers the winner's ReLU input)."""
    h = x.double()
    worst = math.inf
    with torch.no_grad():
        for i, m in enumerate(mods):
            pooled_next = i + 1 < len(mods) and isinstance(mods[i + 1], torch.nn.MaxPool2d)
            if isinstance(m, torch.nn.ReLU) and not pooled_next:
                worst = min(worst, h.abs().min().item())
            if isinstance(m, torch.nn.MaxPool2d):
                k = m.kernel_size
                assert m.stride == k and m.padding == 0, "windows must tile the input"
                bs, c, hh, ww = h.shape
                win = h[:, :, :hh // k * k, :ww // k * k].reshape(bs, c, hh // k, k, ww // k, k)
                top2 = win.transpose(3, 4).reshape(bs, c, hh // k, ww // k, k * k).topk(2).values
                live = top2[..., 0] > 0
                if live.any():
                    worst = min(worst, (top2[..., 0] - top2[..., 1])[live].min().item())
            h = m(h)
    return worst


def conditioned_batch(gen, protos, model):
    """The next batch from gen whose min_margin under model is at least MARGIN."""
    mods = list(copy.deepcopy(model).double())
    for draws in range(1, MAX_DRAWS + 1):
        x, y = batch(gen, protos)
        margin = min_margin(mods, x)
        if margin >= MARGIN:
            return x, y, margin, draws
    raise SystemExit(f"torch_reference.py: no batch with margin {MARGIN} in {MAX_DRAWS} draws")


def np32(t):
    return t.detach().cpu().numpy().astype(np.float32)


def write_run(f, group, spec, init, opt_name, opt_kwargs, seed):
    model, params = build(spec)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(init[n])
    gen = torch.Generator().manual_seed(seed + 1000)
    protos = (torch.rand((CLASSES, 1, 28, 28), generator=gen) < 0.5).float()
    opt_cls = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[opt_name]
    opt = opt_cls(model.parameters(), **opt_kwargs)
    g = f.create_group(group)
    for k, v in opt_kwargs.items():
        g.attrs[k] = v
    xs, ys, losses, margins, draws = [], [], [], [], []
    for _ in range(STEPS):
        x, y, margin, n = conditioned_batch(gen, protos, model)
        margins.append(margin)
        draws.append(n)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        xs.append(np32(x))
        ys.append(y.numpy().astype(np.int32))
        losses.append(float(loss.item()))
    g["x"] = np.stack(xs)
    g["y"] = np.stack(ys)
    g["loss"] = np.array(losses, dtype=np.float64)
    g.attrs["min_margin"] = np.array(margins)
    g.attrs["draws"] = np.array(draws)
    for n, p in params.items():
        g[f"final/{n}"] = np32(p)


def write_model(path, spec, with_adamw, seed):
    torch.manual_seed(seed)  # PyTorch's default init draws from the global generator
    model, params = build(spec)
    init = {n: p.detach().clone() for n, p in params.items()}
    gen = torch.Generator().manual_seed(seed + 1)
    protos = (torch.rand((CLASSES, 1, 28, 28), generator=gen) < 0.5).float()
    x, y, margin, draws = conditioned_batch(gen, protos, model)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    grads = {n: np32(p.grad) for n, p in params.items()}
    # The same batch under CPU autocast: its linear and conv layers compute in bf16.
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits16 = model(x)
    loss16 = torch.nn.functional.cross_entropy(logits16.float(), y)
    loss16.backward()

    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.attrs["spec"] = np.bytes_("\n".join(spec))  # fixed-length: simple to read from C
        f.attrs["batch"] = B
        f.attrs["classes"] = CLASSES
        f.attrs["torch_version"] = np.bytes_(str(torch.__version__))
        f.attrs["min_margin"] = margin
        f.attrs["draws"] = draws
        for n, p in params.items():
            f[f"init/{n}"] = np32(p)
            f[f"grad/{n}"] = grads[n]
            f[f"bf16/grad/{n}"] = np32(p.grad)
        f["x"] = np32(x)
        f["y"] = y.numpy().astype(np.int32)
        f["logits"] = np32(logits)
        f["loss"] = np.float64(loss.item())
        f["bf16/logits"] = np32(logits16.float())
        f["bf16/loss"] = np.float64(loss16.item())
        # The training runs start again from the stored initial parameters.
        write_run(f, "sgd", spec, init, "sgd", SGD, seed)
        if with_adamw:
            write_run(f, "adamw", spec, init, "adamw", ADAMW, seed)
    os.replace(tmp, path)  # a failed run never leaves a file the tests would read


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: torch_reference.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    write_model(os.path.join(out, "mlp.h5"), MLP_SPEC, with_adamw=True, seed=1)
    write_model(os.path.join(out, "cnn.h5"), CNN_SPEC, with_adamw=False, seed=2)
    print(f"torch {torch.__version__}: wrote {out}/mlp.h5, {out}/cnn.h5")


if __name__ == "__main__":
    main()
