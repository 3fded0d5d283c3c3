-- expect: 4: add: f32[8,64] and f32[8,32] do not broadcast
local a = input("a", {8, 64})
local b = input("b", {8, 32})
local c = a + b
loss(mean(c))
