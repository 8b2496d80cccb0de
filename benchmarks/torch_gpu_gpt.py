#!/usr/bin/env python3
"""PyTorch's training tokens/s for the GPT-2 124M-shaped model of bench_gpu_train.sh, on one GPU:
the baseline beside strata's figure, same model, batch, optimizer and GPU, same check run.

    torch_gpu_gpt.py [--steps 20] [--warmup 3] [--batch 8] [--precision bf16 fp32]

The model: 12 pre-LayerNorm blocks, 12 heads, dim 768, context 1024, byte-level vocabulary 256,
the LM head tied to the token table, exact GELU, no dropout; AdamW (lr 3e-4, weight decay 0.1).
PyTorch runs as a user of it would without compiling: eager, fused scaled_dot_product_attention
(flash attention where it applies), bf16 through torch.autocast, the fused AdamW. Tokens are
random (the content does not change the speed). tokens/s is STEPS x batch x context over the
STEPS steps after the warm-up, timed with the device synchronised at both ends. One line per
precision: `torch PREC tokens/s N`, plus the versions.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

L, H, C, T, V = 12, 12, 768, 1024, 256


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, Tn, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, Tn, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, Tn, C))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))


def gpt2_init(model):
    """GPT-2's initialisation, as strata's: normal(0, 0.02) weights and embeddings, zero biases,
    LayerNorms at one and zero (torch's defaults, N(0, 1) embeddings, start near loss 480)."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        elif "ln" in name:
            torch.nn.init.ones_(p)
        else:
            torch.nn.init.normal_(p, 0.0, 0.02)


def tokens_per_s(precision, steps, warmup, batch):
    torch.manual_seed(0)
    model = GPT().cuda()
    gpt2_init(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    data = torch.randint(0, V, (steps + warmup, batch, T + 1), device="cuda")
    losses = []
    for i in range(steps + warmup):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = data[i, :, :-1], data[i, :, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    first = losses[0].item()
    if not math.isfinite(first) or abs(first - math.log(V)) > 1.0:
        raise SystemExit(f"torch_gpu_gpt.py: first loss {first:.3f}, expected near log({V})")
    return steps * batch * T / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_gpu_gpt.py: torch sees no GPU")
    # fp32 as strata's fp32: no TF32 in matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}")
    print(f"GPT-2 124M shape (L {L}, heads {H}, dim {C}, context {T}, vocab {V}), batch {a.batch}, "
          f"{a.steps} timed steps after {a.warmup}")
    for p in a.precision:
        print(f"torch {p} tokens/s {tokens_per_s(p, a.steps, a.warmup, a.batch):.0f}", flush=True)


if __name__ == "__main__":
    main()
