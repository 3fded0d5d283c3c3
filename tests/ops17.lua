-- ops17.lua — a tiny GPT that uses every op issue 17 added: sigmoid, abs,
-- pow (the function and the ^ operator), minimum and maximum (tensor-tensor
-- and with a number), where with a float mask, layernorm without a bias
-- (nn.layernorm's bias = false and a nil b) and nn.linear without one.
-- tests/t_ops17.sh runs it through `kiln check` (single device, --dp 2,
-- --cp 2), the CPU backend against the interpreter, and the CUDA target.
local nn = require "nn"

local c = config{
  vocab = 256, dim = 32, heads = 2, seq = 16, batch = 4,
  lr = 1e-2, min_lr = 1e-3, warmup = 1, steps = 50, weight_decay = 0.0, grad_clip = 1.0,
}
local C = c.dim

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local wte = param("wte.weight", {c.vocab, C}, normal(0.02))
local wpe = param("wpe.weight", {c.seq, C}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))

-- attention, no biases anywhere
local h = nn.layernorm(x, "ln_1", nil, {bias = false})
local qkv = nn.linear(h, "attn.c_attn", C, 3 * C, {bias = false})
local function part(i) return transpose(nn.heads(slice(qkv, -1, i * C + 1, (i + 1) * C), c.heads), 2, 3) end
local o = attention(part(0), part(1), part(2), {causal = true})
x = x + nn.linear(nn.merge_heads(o), "attn.c_proj", C, C, {bias = false})

-- a gated MLP through the new elementwise ops
h = nn.layernorm(x, "ln_2", nil, {bias = false})
local u = nn.linear(h, "mlp.up", C, 2 * C, {bias = false})
local g = nn.linear(h, "mlp.gate", C, 2 * C, {bias = false})
local a = sigmoid(g) * u
a = where(relu(a), a, 0.1 * a)                        -- leaky ReLU through a mask
a = maximum(minimum(a, 0.05), -0.05) + 0.5 * minimum(a, g) + 0.5 * maximum(u, a)
a = a + 0.1 * pow(abs(a) + 0.01, 1.5) + 0.1 * a ^ 2
x = x + nn.linear(a, "mlp.down", 2 * C, C, {bias = false})

x = layernorm(x, param("ln_f.weight", {C}, ones()))  -- no b
local logits = matmul(x, wte, {tb = true})
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
