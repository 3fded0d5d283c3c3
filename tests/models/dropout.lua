-- dropout.lua — tiny.lua's GPT with dropout (issue 17) on the embeddings
-- and on each block's attention and MLP outputs, as GPT-2 trains: the model
-- of tests/t_dropout.sh.  pdrop = 0 gives tiny.lua's network.
local nn = require "nn"

local c = config{
  vocab = 256, dim = 32, layers = 2, heads = 4, seq = 16, batch = 4, pdrop = 0.25,
  lr = 3e-3, min_lr = 3e-4, warmup = 1, steps = 100, weight_decay = 0.0, grad_clip = 1.0,
}

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")

local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02))
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = dropout(embedding(wte, tokens) + embedding(wpe, positions(c.seq)), c.pdrop)

for i = 0, c.layers - 1 do
  x = layer(i, function()
    x = x + dropout(nn.gpt_attention(nn.layernorm(x, "ln_1"), "attn", c), {p = c.pdrop})
    return x + dropout(nn.mlp(nn.layernorm(x, "ln_2"), "mlp", c), c.pdrop)
  end)
end

x = nn.layernorm(x, "ln_f")
local logits = matmul(x, wte, {tb = true})
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
