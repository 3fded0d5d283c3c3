-- tiny.lua — a 2-layer byte-level GPT (GPT-2 architecture, ~120k parameters)
-- small enough to train in kiln's interpreter: `make demo`.
local nn = require "nn"

local c = config{
  vocab = 256, dim = 64, layers = 2, heads = 4, seq = 64, batch = 8,
  lr = 3e-3, min_lr = 3e-4, warmup = 10, steps = 300, weight_decay = 0.0, grad_clip = 1.0,
}

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")

-- token and learned position embeddings; wte is tied to the output layer
local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02), {tp = 1}) -- vocab-parallel under --tp
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))

for i = 0, c.layers - 1 do
  x = layer(i, function() return nn.gpt_block(x, c) end)
end

x = nn.layernorm(x, "ln_f")
local logits = matmul(x, wte, {tb = true}) -- [B,T,C] x [V,C]^T
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
