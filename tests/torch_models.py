"""torch_models.py — the tiny GPT and tiny Llama of models/ in plain PyTorch.

Written from the model files' meaning (models/tiny.lua, models/llama.lua,
models/lib/nn.lua) and the op semantics of compiler/ops.def, not from kiln's
graph: each op below is the textbook formula, so a disagreement with kiln
points at one side's reading of the semantics.  Weights come in a dict keyed
by kiln's parameter names; matmul weights are [in, out] (y = x @ W), as in
kiln.  Shapes are written [B,T,C]; torch 1.13 has no scaled_dot_product_attention,
so attention is spelt out with a causal mask.
"""
import math

import torch


# ---- ops (ops.def semantics) ----

def layernorm(x, w, b, eps):
    """(x-mean)/sqrt(var+eps)*w+b over the last dim, biased variance."""
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rmsnorm(x, w, eps):
    """x*rsqrt(mean(x^2)+eps)*w over the last dim."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    """0.5x(1+tanh(sqrt(2/pi)(x+0.044715x^3)))."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x * torch.sigmoid(x)


def rope(x, theta):
    """Rotate-half RoPE on x[B,T,H,D] at positions 0..T-1: with f_i =
    theta^(-2i/D) and angle = t*f_i (i < D/2),
    out[i] = x[i]cos - x[i+D/2]sin, out[i+D/2] = x[i+D/2]cos + x[i]sin."""
    B, T, H, D = x.shape
    i = torch.arange(D // 2, dtype=torch.float64)
    f = theta ** (-2.0 * i / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * f[None, :]  # [T, D/2]
    cos = torch.cos(ang).to(x.dtype)[None, :, None, :]
    sin = torch.sin(ang).to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def causal_attention(q, k, v, scale):
    """q[B,H,T,D], k/v[B,KH,T,D] -> [B,H,T,D]; query head h reads kv head
    h // (H/KH); key s is visible to query t iff s <= t."""
    H, KH = q.shape[1], k.shape[1]
    group = H // KH
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    T, S = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) * scale
    mask = torch.ones(T, S, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def cross_entropy_mean(logits, targets):
    """mean over tokens of -log softmax(logits)[target]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -logp.gather(-1, targets[..., None]).squeeze(-1).mean()


# ---- models ----
#
# Each takes P (kiln's parameter names -> tensors), the config values that
# shapes cannot tell (heads, kv_heads, eps, theta), tokens/targets [B,T]
# (int64) and returns the mean cross-entropy loss.  The layer count is read
# from the parameter names ("h.<i>.").

def n_layers(P):
    return len({k.split(".")[1] for k in P if k.startswith("h.")})


def split_heads(x, H):
    """[B,T,H*D] -> [B,T,H,D]"""
    B, T, C = x.shape
    return x.reshape(B, T, H, C // H)


def merge_heads(o):
    """[B,H,T,D] -> [B,T,H*D]"""
    B, H, T, D = o.shape
    return o.transpose(1, 2).reshape(B, T, H * D)


def gpt_loss(P, cfg, tokens, targets, ignore_index=None):
    """models/tiny.lua: GPT-2 with learned positions, pre-LN blocks, GELU MLP
    (4C), a fused c_attn [C,3C], final LayerNorm and logits tied to wte.
    ignore_index: PyTorch's own F.cross_entropy(..., ignore_index=) instead
    (the reference for kiln's loss_mask fed by --ignore-index, issue 17)."""
    H, eps = cfg["heads"], cfg.get("eps", 1e-5)
    B, T = tokens.shape
    C = P["wte.weight"].shape[1]
    x = P["wte.weight"][tokens] + P["wpe.weight"][torch.arange(T)][None]

    def ln(x, name):
        return layernorm(x, P[name + ".weight"], P[name + ".bias"], eps)

    def linear(x, name):
        return x @ P[name + ".weight"] + P[name + ".bias"]

    for i in range(n_layers(P)):
        h = f"h.{i}."
        qkv = linear(ln(x, h + "ln_1"), h + "attn.c_attn")
        q, k, v = (split_heads(qkv[..., j * C:(j + 1) * C], H).transpose(1, 2) for j in range(3))
        o = causal_attention(q, k, v, 1.0 / math.sqrt(C // H))
        x = x + linear(merge_heads(o), h + "attn.c_proj")
        x = x + linear(gelu_tanh(linear(ln(x, h + "ln_2"), h + "mlp.c_fc")), h + "mlp.c_proj")
    x = ln(x, "ln_f")
    logits = x @ P["wte.weight"].t()
    if ignore_index is not None:
        return torch.nn.functional.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T),
                                                 ignore_index=ignore_index)
    return cross_entropy_mean(logits, targets)


def llama_loss(P, cfg, tokens, targets):
    """models/llama.lua: RMSNorm, RoPE (rotate-half) on q and k, grouped-query
    attention, SwiGLU MLP, final RMSNorm, untied output layer, no biases."""
    H, KH, eps, theta = cfg["heads"], cfg["kv_heads"], cfg["norm_eps"], cfg["theta"]
    x = P["tok_embeddings.weight"][tokens]
    C = x.shape[-1]
    D = C // H

    def W(name):
        return P[name + ".weight"]

    for i in range(n_layers(P)):
        h = f"h.{i}."
        a = rmsnorm(x, W(h + "attention_norm"), eps)
        q = rope(split_heads(a @ W(h + "attention.wq"), H), theta).transpose(1, 2)
        k = rope(split_heads(a @ W(h + "attention.wk"), KH), theta).transpose(1, 2)
        v = split_heads(a @ W(h + "attention.wv"), KH).transpose(1, 2)
        o = causal_attention(q, k, v, 1.0 / math.sqrt(D))
        x = x + merge_heads(o) @ W(h + "attention.wo")
        f = rmsnorm(x, W(h + "ffn_norm"), eps)
        x = x + (silu(f @ W(h + "feed_forward.w1")) * (f @ W(h + "feed_forward.w3"))) @ W(h + "feed_forward.w2")
    x = rmsnorm(x, W("norm"), eps)
    return cross_entropy_mean(x @ W("output"), targets)
