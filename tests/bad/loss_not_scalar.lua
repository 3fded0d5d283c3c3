-- expect: 3: loss: must be a scalar f32, got f32[8]
local x = input("x", {8, 64})
loss(mean(x, 2))
