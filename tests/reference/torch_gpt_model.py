"""nanoGPT's GPT-2 in plain torch, as strata's model.type = "gpt" builds it: the one model both
the parity reference (torch_gpt_reference.py) and the speed baseline (benchmarks/bench_gpt.py)
run, so the benchmark's PyTorch side is the model the parity test checks strata against.

Token + position embedding, `layers` pre-LayerNorm blocks (x + c_proj(causal_attention(
c_attn(ln_1(x)))), then x + mlp.c_proj(gelu(mlp.c_fc(ln_2(x))))), a final LayerNorm and an
output layer tied to the token embedding (lm_head.weight is wte). Attention scales by
1/sqrt(head size) and masks the future with -inf through an explicit mask and softmax (as
nanoGPT on torch < 2.0: torch 1.13 has no fused scaled_dot_product_attention); GELU is the
exact erf form (nn.GELU()), or with gelu="tanh" GPT-2's tanh form (strata's model.gelu =
"tanh"); LayerNorm eps is 1e-5. No dropout. Parameter names are strata's
(strata_params()).
"""
import math

import torch
import torch.nn as nn


def gpt(vocab, dim, heads, context, layers, gelu="none"):
    """The model, with torch's default initialisation (callers set their own). gelu: torch's
    `approximate`, "none" (erf) or "tanh"."""

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(dim, 3 * dim)
            self.c_proj = nn.Linear(dim, dim)
            self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).tril())

        def forward(self, x):
            B, T, C = x.shape
            hs = C // heads
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, hs).transpose(1, 2) for t in (q, k, v))  # (B,nh,T,hs)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(dim, 4 * dim)
            self.gelu = nn.GELU(approximate=gelu)  # as strata's model.gelu
            self.c_proj = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(dim)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(dim)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, dim)
            self.wpe = nn.Embedding(context, dim)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim)
            self.lm_head = nn.Linear(dim, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2 and strata

        def forward(self, idx):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.h:
                x = b(x)
            return self.lm_head(self.ln_f(x))

        def strata_params(self):
            """strata's global name of each parameter (the tied lm_head has none of its own)."""
            p = {"embedding1.wte": self.wte.weight, "embedding1.wpe": self.wpe.weight}
            for i, b in enumerate(self.h, start=1):
                for n, t in b.named_parameters():
                    p[f"block{i}.{n}"] = t
            p["layernorm1.weight"] = self.ln_f.weight
            p["layernorm1.bias"] = self.ln_f.bias
            return p

    return GPT()
