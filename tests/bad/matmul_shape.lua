-- expect: 5: matmul: f32[8,64,64] x f32[32,64]: inner dims differ
local x = input("x", {8, 64, 64})
local w = param("w", {32, 64}, normal(0.02))
-- [8,64,64] x [32,64]: 64 != 32
local y = matmul(x, w)
loss(mean(y))
