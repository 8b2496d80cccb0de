#!/usr/bin/python3
"""PyTorch reference data for strata's GPT parity tests (tests/unit/test_torch_parity.cpp).

Usage: torch_gpt_reference.py OUT_DIR   -> writes OUT_DIR/gpt.h5

The model is nanoGPT's GPT-2 in plain torch (torch_gpt_model.py, shared with the speed
benchmark): what strata's model.type = "gpt" builds (src/model/layers_gpt.cpp,
RunConfig::model_spec).

The file holds:
  attrs: spec (strata's layer specs joined by newlines), vocab, dim, heads, context, layers,
         batch, torch_version
  init/<name>       initial parameters under strata's global names ("embedding1.wte",
                    "block1.attn.c_attn.weight", "layernorm1.bias", ...)
  x, y              one batch: (B,T) int32 input tokens and (B,T) int32 next-token targets
  logits            (B,T,V) float32
  loss              mean cross-entropy over the B*T positions (float64 of torch's float32)
  grad/<name>       every parameter's gradient; embedding1.wte's is the sum of its two uses
  tanh/logits, tanh/loss, tanh/grad/<name>
                    the same batch through the model with GPT-2's tanh GELU
                    (nn.GELU(approximate="tanh")): model.gelu = "tanh"'s reference
  bf16/logits, bf16/loss, bf16/grad/<name>
                    the same under torch.autocast("cpu", dtype=torch.bfloat16) (the linear
                    layers, the LM head and the attention's two matmuls in bf16; softmax,
                    LayerNorm, GELU, parameters and gradients fp32): train.precision = "bf16"'s
                    reference
  adamw/x, adamw/y  20 batches (20,B,T)
  adamw/loss        the 20 losses, each computed before its step's update
  adamw/final/<name> the parameters after the 20 steps
  adamw attrs: lr, betas, eps, weight_decay (torch.optim.AdamW over all parameters, one group:
               strata's AdamW decays every parameter too)

Initial parameters: GPT-2's scheme (N(0, STD) weights, the two residual projections
N(0, STD / sqrt(2 * layers))) but with STD = 0.15 instead of GPT-2's 0.02, and the biases and
LayerNorm parameters drawn too (N(0, 0.02); 1 + N(0, 0.1) and N(0, 0.1)) instead of zeros and
ones. At 0.02 and dim 32 every activation is small: the attention is nearly uniform and GELU's
inputs are ~0.1, where tanh-GELU agrees with erf-GELU to 2e-6 of the logits (below the
tolerance). At 0.15 they are O(1), the attention is far from uniform, tanh-GELU is 3e-4 off, and
every parameter changes the logits (a bias strata forgot to add would not show at zero).

Data: windows of T + 1 tokens from one long sequence of a fixed random Markov chain (each token
is followed by one of 4 successors), cut as strata's loader cuts a token file (x = the first T,
y = the last T). The chain is learnable, so the 20 AdamW losses fall well below log(V) and the
steps exercise real learning, not noise. GELU, softmax and LayerNorm are smooth, so unlike the
ReLU models of torch_reference.py no batch needs to be redrawn for conditioning.

Everything is float32, one thread. Without torch this script fails (no fallback), and so does
the CTest fixture that runs it.
"""
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_model import gpt  # noqa: E402

VOCAB, DIM, HEADS, CONTEXT, LAYERS, BATCH = 64, 32, 4, 16, 2, 4
STEPS = 20
SUCCESSORS = 4
SEED = 3
STD = 0.15  # the weights' (see "Initial parameters")
ADAMW = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


def strata_spec():
    """RunConfig::model_spec for model.type = "gpt" with these sizes (no dropout, recompute none)."""
    return [f"embedding {DIM}"] + [f"block {HEADS}"] * LAYERS + ["layernorm", "lmhead"]


def init_params(params, gen):
    proj_std = STD / math.sqrt(2 * LAYERS)
    with torch.no_grad():
        for n, p in params.items():
            if n.endswith("c_proj.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * proj_std)
            elif n.endswith(".bias") and (".ln_" in n or n.startswith("layernorm")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif ".ln_" in n or n.startswith("layernorm"):  # LayerNorm weights
                p.copy_(1 + torch.randn(p.shape, generator=gen) * 0.1)
            elif n.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            else:  # wte, wpe, c_attn, c_fc
                p.copy_(torch.randn(p.shape, generator=gen) * STD)


class MarkovText:
    """A fixed random chain: token a is followed by one of SUCCESSORS tokens, uniformly."""

    def __init__(self, gen):
        self.next = torch.stack([torch.randperm(VOCAB, generator=gen)[:SUCCESSORS]
                                 for _ in range(VOCAB)])
        self.gen = gen

    def batch(self):
        """(x, y): BATCH windows of CONTEXT + 1 tokens, split as strata's loader splits them."""
        w = torch.empty(BATCH, CONTEXT + 1, dtype=torch.long)
        w[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=self.gen)
        for t in range(1, CONTEXT + 1):
            pick = torch.randint(0, SUCCESSORS, (BATCH,), generator=self.gen)
            w[:, t] = self.next[w[:, t - 1], pick]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))  # mean over B*T


def np32(t):
    return t.detach().cpu().numpy().astype(np.float32)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: torch_gpt_reference.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(SEED)

    model = gpt(VOCAB, DIM, HEADS, CONTEXT, LAYERS)
    params = model.strata_params()
    assert sum(p.numel() for p in params.values()) == sum(p.numel() for p in model.parameters())
    init_params(params, gen)
    init = {n: p.detach().clone() for n, p in params.items()}
    text = MarkovText(gen)

    x, y = text.batch()
    logits = model(x)
    loss = loss_of(logits, y)
    loss.backward()
    grads = {n: np32(p.grad) for n, p in params.items()}
    # The same batch with the tanh GELU (its own model, the same initial parameters).
    model_tanh = gpt(VOCAB, DIM, HEADS, CONTEXT, LAYERS, gelu="tanh")
    params_tanh = model_tanh.strata_params()
    with torch.no_grad():
        for n, p in params_tanh.items():
            p.copy_(init[n])
    logits_tanh = model_tanh(x)
    loss_tanh = loss_of(logits_tanh, y)
    loss_tanh.backward()
    # The same batch under CPU autocast.
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits16 = model(x)
    loss16 = loss_of(logits16.float(), y)
    loss16.backward()

    path = os.path.join(out, "gpt.h5")
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.attrs["spec"] = np.bytes_("\n".join(strata_spec()))  # fixed-length: simple from C
        for k, v in dict(vocab=VOCAB, dim=DIM, heads=HEADS, context=CONTEXT, layers=LAYERS,
                         batch=BATCH).items():
            f.attrs[k] = v
        f.attrs["torch_version"] = np.bytes_(str(torch.__version__))
        for n, p in params.items():
            f[f"init/{n}"] = np32(init[n])
            f[f"grad/{n}"] = grads[n]
            f[f"bf16/grad/{n}"] = np32(p.grad)
            f[f"tanh/grad/{n}"] = np32(params_tanh[n].grad)
        f["x"] = x.numpy().astype(np.int32)
        f["y"] = y.numpy().astype(np.int32)
        f["logits"] = np32(logits)
        f["loss"] = np.float64(loss.item())
        f["tanh/logits"] = np32(logits_tanh)
        f["tanh/loss"] = np.float64(loss_tanh.item())
        f["bf16/logits"] = np32(logits16.float())
        f["bf16/loss"] = np.float64(loss16.item())

        # 20 AdamW steps from the same initial parameters.
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(init[n])
        opt = torch.optim.AdamW(model.parameters(), **ADAMW)
        g = f.create_group("adamw")
        for k, v in ADAMW.items():
            g.attrs[k] = v
        xs, ys, losses = [], [], []
        for _ in range(STEPS):
            x, y = text.batch()
            opt.zero_grad()
            loss = loss_of(model(x), y)
            loss.backward()
            opt.step()
            xs.append(x.numpy().astype(np.int32))
            ys.append(y.numpy().astype(np.int32))
            losses.append(float(loss.item()))
        g["x"] = np.stack(xs)
        g["y"] = np.stack(ys)
        g["loss"] = np.array(losses, dtype=np.float64)
        for n, p in params.items():
            g[f"final/{n}"] = np32(p)
    os.replace(tmp, path)  # a failed run never leaves a file the tests would read
    print(f"torch {torch.__version__}: wrote {path} (AdamW losses {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}; log(V) = {math.log(VOCAB):.4f})")


if __name__ == "__main__":
    main()
