-- hf_names.lua — a small model whose params carry Hugging Face Llama names
-- (tests/t_pretrained.sh): layer(i, fn, {prefix = "model.layers."}); with
-- --set hf=0 the layer adds nothing ({prefix = false}) and the names are
-- the model's.
local c = config{ vocab = 256, dim = 32, ffn = 64, layers = 2, seq = 16, batch = 2, hf = 1 }
local prefix = c.hf == 1 and "model.layers." or false

local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local x = embedding(param("model.embed_tokens.weight", {c.vocab, c.dim}, normal(0.02)), tokens)
for i = 0, c.layers - 1 do
  x = layer(i, function()
    local name = prefix and "mlp.up_proj.weight" or ("layers." .. i .. ".up")
    local w = param(name, {c.dim, c.ffn}, normal(0.02))
    return x + matmul(silu(matmul(x, w)), w, {tb = true})
  end, {prefix = prefix})
end
x = rmsnorm(x, param("model.norm.weight", {c.dim}, ones()), 1e-5)
local logits = matmul(x, param("lm_head.weight", {c.vocab, c.dim}, normal(0.02)), {tb = true})
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
