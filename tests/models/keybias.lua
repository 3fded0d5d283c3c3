-- keybias.lua — a 1-layer GPT whose attention has its own key bias: a
-- parameter whose true gradient is exactly zero (softmax over the keys is
-- invariant to adding q·bk to every score of a row), so its computed gradient
-- is rounding noise.  `kiln check` must pass it (tests/t_check.sh).
local nn = require "nn"

local c = config{vocab = 64, dim = 32, heads = 2, layers = 1, seq = 16, batch = 4,
                 lr = 1e-2, min_lr = 1e-3, warmup = 1, steps = 10, weight_decay = 0.0, grad_clip = 1.0}

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")

local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02))
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))

local function attn(h)
  local function proj(name) return transpose(nn.heads(nn.linear(h, "attn." .. name, c.dim, c.dim), c.heads), 2, 3) end
  local q, k, v = proj("q"), proj("k"), proj("v")
  local o = attention(q, k, v, {causal = true})
  return nn.linear(nn.merge_heads(o), "attn.o", c.dim, c.dim)
end

x = layer(0, function()
  local y = x + attn(nn.layernorm(x, "ln_1"))
  return y + nn.mlp(nn.layernorm(y, "ln_2"), "mlp", c)
end)

x = nn.layernorm(x, "ln_f")
loss(mean(cross_entropy(matmul(x, wte, {tb = true}), targets)))
