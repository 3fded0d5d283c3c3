-- expect: 3: attention: window must be an integer, got 2.5
local q = input("q", {1, 2, 8, 4})
local o = attention(q, q, q, {window = 2.5})
loss(mean(o))
