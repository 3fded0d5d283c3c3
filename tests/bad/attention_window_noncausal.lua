-- expect: 3: attention: window needs causal = true
local q = input("q", {1, 2, 8, 4})
local o = attention(q, q, q, {causal = false, window = 4})
loss(mean(o))
