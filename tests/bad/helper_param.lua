-- expect: 5: matmul: f32[8,64] x f32[32,16]: inner dims differ, with parameter fc2.weight
-- a shape error inside a helper names the parameter it was building
local nn = require "nn"
local x = input("x", {8, 64})
local h = nn.linear(x, "fc2", 32, 16)
loss(mean(h))
