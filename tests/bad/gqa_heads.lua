-- expect: 5: attention: 6 query heads not a multiple of 4 kv heads
local q = input("q", {2, 6, 16, 8})
local k = input("k", {2, 4, 16, 8})
local v = input("v", {2, 4, 16, 8})
local o, lse = attention(q, k, v)
