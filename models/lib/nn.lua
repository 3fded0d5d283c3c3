-- nn.lua — transformer building blocks written on kiln's DSL primitives.
--
--   local nn = require "nn"
--
-- Shapes: B batch, T sequence, C model dim, H query heads, KH key/value heads,
-- D head dim, F feed-forward dim, V vocabulary.  Weights are [in, out]
-- (y = x @ W, the Hugging Face Conv1D layout) and f32.  Helpers name their
-- parameters "<name>.weight" / "<name>.bias"; inside layer(i, fn) the front end
-- prefixes them with "h.<i>.".  Errors in the ops they build are reported at the
-- model line that called the helper.
local nn = {}

-- o, the options table of helper fn (for parameter name), with only the keys
-- in keys (the list next to each helper): a misspelled option is an error at
-- the line that passed it, not a silent default.  Returns o or {}.
local function options(o, fn, name, keys)
  if o == nil then return {} end
  if type(o) ~= "table" then
    error(string.format("%s(%s): options must be a table, got %s", fn, name, type(o)), 3)
  end
  for k in pairs(o) do
    local known = false
    for _, key in ipairs(keys) do known = known or k == key end
    if not known then
      error(string.format("%s(%s): unknown option %s (options: %s)", fn, name, tostring(k),
                          table.concat(keys, ", ")), 3)
    end
  end
  return o
end

-- n rounded up to a multiple of m (GPT-2 pads its 50257-token vocab to 50304).
function nn.round_up(n, m) return (n + m - 1) // m * m end

-- std of the projections that write into the residual stream: GPT-2 scales
-- them by 1/sqrt(2 * layers) so the stream's variance does not grow with depth.
function nn.proj_std(c) return 0.02 / math.sqrt(2 * c.layers) end

-- y = x @ W + b, W [din, dout] ~ normal(o.std or 0.02), b [dout] zeros;
-- o.bias = false: no bias.  o.tp: Megatron's tensor-parallel layout
-- (docs/parallel.md): "col" splits W's columns and b over the tp ranks (each
-- rank computes its slice of y), "row" splits W's rows (each rank holds a
-- slice of x's features and a partial sum of y; b is replicated, added once
-- the sum is reduced).  o.tp_blocks = k with "col": W's columns are k
-- blocks (a fused QKV) and each rank holds its slice of every block.
-- Without o.tp the layer is replicated under --tp.
local linear_options = {"std", "bias", "tp", "tp_blocks"}
function nn.linear(x, name, din, dout, o)
  o = options(o, "nn.linear", name, linear_options)
  if o.tp ~= nil and o.tp ~= "col" and o.tp ~= "row" then
    error(string.format("nn.linear(%s): tp must be \"col\" or \"row\", got %s", name, tostring(o.tp)), 2)
  end
  local wtp = o.tp == "col" and {tp = 2, tp_blocks = o.tp_blocks} or o.tp == "row" and {tp = 1} or nil
  local y = matmul(x, param(name .. ".weight", {din, dout}, normal(o.std or 0.02), wtp))
  if o.bias == false then return y end
  return y + param(name .. ".bias", {dout}, zeros(), o.tp == "col" and {tp = 1, tp_blocks = o.tp_blocks} or nil)
end

-- LayerNorm over the last dim with weight (ones) and bias (zeros);
-- o.bias = false: no bias.
function nn.layernorm(x, name, eps, o)
  o = o or {}
  local C = x.shape[x.rank]
  local w = param(name .. ".weight", {C}, ones())
  if o.bias == false then return layernorm(x, w, nil, eps) end
  return layernorm(x, w, param(name .. ".bias", {C}, zeros()), eps)
end

-- RMSNorm over the last dim with weight (ones).
function nn.rmsnorm(x, name, eps)
  return rmsnorm(x, param(name .. ".weight", {x.shape[x.rank]}, ones()), eps)
end

-- [B,T,H*D] -> [B,T,H,D]
function nn.heads(x, H)
  local s = x.shape
  return reshape(x, {s[1], s[2], H, s[3] // H})
end

-- [B,H,T,D] (attention layout) -> [B,T,H*D]
function nn.merge_heads(x)
  local s = x.shape
  return reshape(transpose(x, 2, 3), {s[1], s[3], s[2] * s[4]})
end

-- GPT-2 causal self-attention: one fused projection c_attn [C,3C] gives q, k, v.
function nn.gpt_attention(x, name, c)
  local C = c.dim
  local qkv = nn.linear(x, name .. ".c_attn", C, 3 * C, {tp = "col", tp_blocks = 3})
  local function part(i) return transpose(nn.heads(slice(qkv, -1, i * C + 1, (i + 1) * C), c.heads), 2, 3) end
  local o = attention(part(0), part(1), part(2), {causal = true, window = c.window ~= 0 and c.window or nil})
  return nn.linear(nn.merge_heads(o), name .. ".c_proj", C, C, {std = nn.proj_std(c), tp = "row"})
end

-- GPT-2 MLP: C -> 4C -> GELU (tanh) -> C.
function nn.mlp(x, name, c)
  local h = gelu(nn.linear(x, name .. ".c_fc", c.dim, 4 * c.dim, {tp = "col"}))
  return nn.linear(h, name .. ".c_proj", 4 * c.dim, c.dim, {std = nn.proj_std(c), tp = "row"})
end

-- Pre-LayerNorm GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
function nn.gpt_block(x, c)
  x = x + nn.gpt_attention(nn.layernorm(x, "ln_1"), "attn", c)
  return x + nn.mlp(nn.layernorm(x, "ln_2"), "mlp", c)
end

-- Llama attention with grouped-query heads: wq gives H heads, wk and wv only
-- KH; RoPE on [B,T,H,D], then [B,H,T,D] for attention.  K and V are never
-- expanded to H heads (attention reads kv head h / (H/KH)).
function nn.llama_attention(x, pos, c)
  local C, D = c.dim, c.dim // c.heads
  local function proj(name, H) return nn.heads(nn.linear(x, "attention." .. name, C, H * D, {bias = false, tp = "col"}), H) end
  local q = transpose(rope(proj("wq", c.heads), pos, c.theta), 2, 3)
  local k = transpose(rope(proj("wk", c.kv_heads), pos, c.theta), 2, 3)
  local v = transpose(proj("wv", c.kv_heads), 2, 3)
  local o = attention(q, k, v, {causal = true, window = c.window ~= 0 and c.window or nil})
  return nn.linear(nn.merge_heads(o), "attention.wo", c.heads * D, C, {bias = false, std = nn.proj_std(c), tp = "row"})
end

-- SwiGLU: (silu(x @ w1) * (x @ w3)) @ w2.
function nn.swiglu(x, name, c)
  local col = {bias = false, tp = "col"}
  local gate = silu(nn.linear(x, name .. ".w1", c.dim, c.ffn, col))
  local up = nn.linear(x, name .. ".w3", c.dim, c.ffn, col)
  return nn.linear(gate * up, name .. ".w2", c.ffn, c.dim, {bias = false, std = nn.proj_std(c), tp = "row"})
end

-- Llama block: x + attn(rmsnorm(x)), then + swiglu(rmsnorm(x)).
function nn.llama_block(x, pos, c)
  x = x + nn.llama_attention(nn.rmsnorm(x, "attention_norm", c.norm_eps), pos, c)
  return x + nn.swiglu(nn.rmsnorm(x, "ffn_norm", c.norm_eps), "feed_forward", c)
end

return nn
