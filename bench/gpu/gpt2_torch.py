"""gpt2_torch.py — the PyTorch peer of kiln's GPT-2 124M CUDA trainer (bench/gpu/check.sh).

The model of models/gpt2.lua written the way a careful PyTorch user writes it
(nanoGPT / llm.c's train_gpt2.py): pre-LN blocks, learned positions, the
vocabulary padded from 50257 to 50304 rows and tied to the classifier, tanh
GELU, one fused c_attn projection, causal attention through
F.scaled_dot_product_attention with the flash backend forced, GPT-2 init
(normal 0.02, residual projections 0.02/sqrt(2L), zero biases).  Training is
what kiln's trainer does per step: bf16 autocast over the forward and the
loss (f32 master weights, as kiln's bf16 copies over f32 masters), backward,
global grad-norm clip at 1.0, fused AdamW (lr 6e-4, betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on matrices only, as compiler/optimizer.c).

Timing: the batches are drawn up front and sit on the GPU; each step is
timed from its start to a torch.cuda.synchronize() at its end (kiln's rt_step
also ends in a stream synchronize), with no .item() inside; the first
--warmup steps (torch.compile's compilation happens in the first) are left
out and the median of the timed steps is reported, together with their mean.

Output: one JSON line on stdout (the last line), read by check.sh:
  {"impl", "mode", "batch", "seq", "tokens_per_s" (from the median step),
   "step_ms_median", "step_ms_mean", "first_loss", "last_loss", "compile_s"
   (eager: 0; compile: the first step's time), "peak_mem_gib", "torch",
   "sdpa" ("flash" when forced, "default" when the backend API is missing),
   "device"}.

usage: gpt2_torch.py --data FILE [--mode eager|compile] [--batch 32] [--seq 1024]
                     [--warmup 5] [--steps 20] [--layers 12 --heads 12 --dim 768 --vocab 50257]
                     [--device cuda|cpu] [--seed 1337]
FILE: an llm.c token shard (.bin: 256 int32 header, magic 20240520, then
uint16 or uint32 tokens) or any other file, whose bytes are the tokens.
--device cpu (fp32 eager, no fused AdamW) exists for a smoke test of this
script on a machine without a GPU; its numbers mean nothing.
"""
import argparse
import contextlib
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SHARD_MAGIC = 20240520


def load_tokens(path):
    """The tokens of an llm.c shard, or the bytes of any other file."""
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size >= 1024:
        head = raw[:1024].view(np.int32)
        if head[0] == SHARD_MAGIC and head[1] in (1, 2):
            width = np.uint16 if head[1] == 1 else np.uint32
            return raw[1024:].view(width)[: int(head[2])].astype(np.int64)
    return raw.astype(np.int64)


def causal_attention(q, k, v):
    """SDPA (torch >= 2.0); the plain softmax only for the CPU smoke test on older torch."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class Block(nn.Module):
    def __init__(self, C, H, proj_std):
        super().__init__()
        self.H = H
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        for lin in (self.c_proj, self.mlp_proj):
            lin.proj_std = proj_std

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, L, H, C, T):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H, 0.02 / math.sqrt(2 * L)) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for m in self.modules():  # GPT-2 init, as models/lib/nn.lua
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=getattr(m, "proj_std", 0.02))
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied, as gpt2.lua
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def flash_only():
    """Force the flash SDPA backend; (a function making a fresh context per
    step, name): sdpa_kernel's context is a generator's, entered only once."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])), "flash"
    except ImportError:
        return contextlib.nullcontext, "default"


def batches(tokens, n, B, T, gen):
    """n batches of B random windows of T+1 tokens: (x, y) int64 [n, B, T]."""
    ix = torch.randint(len(tokens) - T - 1, (n, B), generator=gen)
    win = torch.from_numpy(tokens)[ix.unsqueeze(-1) + torch.arange(T + 1)]
    return win[..., :-1].contiguous(), win[..., 1:].contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 1:
        sys.exit("gpt2_torch.py: --steps and --warmup must be at least 1")
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("gpt2_torch.py: torch sees no CUDA device")
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(a.device)

    tokens = load_tokens(a.data)
    if len(tokens) < a.seq + 2:
        sys.exit(f"gpt2_torch.py: {a.data} holds {len(tokens)} tokens, fewer than one window of {a.seq + 1}")
    if tokens.max() >= a.vocab:
        sys.exit(f"gpt2_torch.py: {a.data} has token {tokens.max()} >= vocab {a.vocab}")
    V = (a.vocab + 127) // 128 * 128
    gen = torch.Generator().manual_seed(a.seed)
    xs, ys = batches(tokens, a.warmup + a.steps, a.batch, a.seq, gen)
    xs, ys = xs.to(dev), ys.to(dev)

    model = GPT(V, a.layers, a.heads, a.dim, a.seq).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    fwd = torch.compile(model) if a.mode == "compile" else model
    sdpa_ctx, sdpa = flash_only() if cuda else (contextlib.nullcontext, "default")
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    losses, times = [], []
    sync()
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        with sdpa_ctx(), amp():
            loss = fwd(xs[step], ys[step])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            sys.exit(f"gpt2_torch.py: step {step + 1}: loss is {losses[-1]}")
        print(f"step {step + 1:3d} loss {losses[-1]:.4f} {1e3 * times[-1]:8.1f} ms", file=sys.stderr, flush=True)

    timed = times[a.warmup:]
    med = statistics.median(timed)
    print(json.dumps({
        "impl": f"torch {a.mode}", "mode": a.mode, "batch": a.batch, "seq": a.seq,
        "tokens_per_s": a.batch * a.seq / med, "step_ms_median": 1e3 * med,
        "step_ms_mean": 1e3 * statistics.fmean(timed), "first_loss": losses[0], "last_loss": losses[-1],
        "compile_s": times[0] if a.mode == "compile" else 0.0,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "torch": torch.__version__, "sdpa": sdpa, "device": torch.cuda.get_device_name() if cuda else "cpu",
    }), flush=True)


if __name__ == "__main__":
    main()
