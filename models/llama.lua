-- llama.lua — a Llama-3 style decoder: RMSNorm, RoPE, grouped-query attention
-- (kv_heads < heads), SwiGLU MLP, untied output layer.  The default shape is
-- Llama-3.2-1B's (with an untied head); tests run it small:
--   --set layers=2 --set dim=64 --set heads=4 --set kv_heads=2 --set ffn=128
--   --set vocab=256 --set seq=32 --set batch=2
-- Weights are [in, out] (y = x @ W): transpose Meta/HF [out, in] matrices to load them.
local nn = require "nn"

local c = config{
  vocab = 128256, dim = 2048, layers = 16, heads = 32, kv_heads = 8, ffn = 8192,
  seq = 2048, batch = 1, theta = 500000.0, norm_eps = 1e-5,
  lr = 3e-4, min_lr = 3e-5, warmup = 2000, steps = 100000, weight_decay = 0.1, grad_clip = 1.0,
}

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")

local x = embedding(param("tok_embeddings.weight", {c.vocab, c.dim}, normal(0.02), {tp = 1}), tokens) -- vocab-parallel under --tp
local pos = positions(c.seq)

for i = 0, c.layers - 1 do
  x = layer(i, function() return nn.llama_block(x, pos, c) end)
end

x = nn.rmsnorm(x, "norm", c.norm_eps)
local logits = nn.linear(x, "output", c.dim, c.vocab, {bias = false, tp = "col"}) -- split on the vocabulary
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
