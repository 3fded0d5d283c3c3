-- expect: 3: attention: window must be an integer in [1, 2^31-1] (keys per query, itself included), got 0
local q = input("q", {1, 2, 8, 4})
local o = attention(q, q, q, {window = 0})
loss(mean(o))
