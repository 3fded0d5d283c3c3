-- concat256.lua — concat of the documented maximum of 256 inputs (tests/t_dsl.sh):
-- every pass, the interpreter and kiln check's dp/cp comparisons handle a node
-- with 256 inputs (autodiff and parallelize once stopped at 64).
local c = config{n = 256, batch = 2, seq = 4, vocab = 16}
local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local e = embedding(param("wte", {c.vocab, 2}, normal(0.02)), tokens)
local parts = {}
for i = 1, c.n do parts[i] = e * param("s" .. i, {2}, normal(1.0)) end
local logits = matmul(concat(parts, -1), param("proj", {2 * c.n, c.vocab}, normal(0.02)))
output("logits", logits)
loss(mean(cross_entropy(logits, targets)))
