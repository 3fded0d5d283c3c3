-- gpt2.lua — GPT-2 (124M by default; --set layers=24 dim=1024 heads=16 for
-- 350M).  Parameter names and layouts follow Hugging Face's GPT2Model without
-- the "transformer." prefix (c_attn.weight is [C,3C], y = x @ W), so its
-- checkpoints load as they are, except wte, padded from 50257 to 50304 rows.
local nn = require "nn"

local c = config{
  vocab = 50257, vocab_multiple = 128, dim = 768, layers = 12, heads = 12, seq = 1024, batch = 8,
  lr = 6e-4, min_lr = 6e-5, warmup = 700, steps = 19073, weight_decay = 0.1, grad_clip = 1.0,
}

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")

-- padded vocabulary rows are never targets; they learn to be improbable
local V = nn.round_up(c.vocab, c.vocab_multiple)
local wte = param("wte.weight", {V, c.dim}, normal(0.02), {tp = 1}) -- vocab-parallel under --tp
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))

for i = 0, c.layers - 1 do
  x = layer(i, function() return nn.gpt_block(x, c) end)
end

x = nn.layernorm(x, "ln_f")
local logits = matmul(x, wte, {tb = true}) -- tied: [B,T,C] x [V,C]^T
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
