"""torch_gpt.py — the PyTorch peer of bench/cpu_vs_torch.sh.

The same GPT as models/tiny.lua (pre-LN, learned positions, tied embeddings,
tanh GELU, causal attention) written the way a PyTorch user would: nn.Linear,
F.layer_norm, F.cross_entropy and torch.optim.AdamW with foreach=True (the
multi-tensor path, faster than torch 1.13's default per-parameter loop).
The optimizer is kiln's: betas (0.9, 0.95), eps 1e-8, gradient clipping at
1.0, weight decay WD on matrices only (biases, norm gains and nothing else
undecayed, compiler/optimizer.c), a constant learning rate LR (the kiln side
compiles --lr LR --min-lr LR --warmup 0 --weight-decay WD).  Trains on
random byte windows of the corpus; after 2 warm-up steps, prints tokens/s as
all timed steps' tokens over the sum of their step times (forward, backward,
clipping and the optimizer step), as bench/cpu_vs_torch.sh takes kiln's.

usage: torch_gpt.py CORPUS LAYERS HEADS DIM SEQ BATCH STEPS THREADS LR WD
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(C // self.H))
        y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, L, H, C, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1))
        for m in self.modules():  # GPT-2 init, as models/lib/nn.lua
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask[:T, :T])
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    if len(sys.argv) != 11:
        sys.exit("usage: torch_gpt.py CORPUS LAYERS HEADS DIM SEQ BATCH STEPS THREADS LR WD")
    path, (L, H, C, T, B, steps, threads), (lr, wd) = sys.argv[1], map(int, sys.argv[2:9]), map(float, sys.argv[9:])
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    data = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8).long()
    model = GPT(256, L, H, C, T)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    flat = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": flat, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    warm, elapsed, last = 2, 0.0, 0.0
    for step in range(warm + steps):
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([data[i:i + T] for i in ix])
        y = torch.stack([data[i + 1:i + T + 1] for i in ix])
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        last = loss.item()
        if step >= warm:
            elapsed += time.perf_counter() - t0
    print(f"torch tokens/s {B * T * steps / elapsed:.1f} loss {last:.4f}")


if __name__ == "__main__":
    main()
