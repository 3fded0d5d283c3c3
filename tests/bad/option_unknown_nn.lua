-- expect: 4: nn.linear(fc1): unknown option biass (options: std, bias, tp, tp_blocks)
local nn = require "nn"
local x = input("x", {8, 64})
local h = nn.linear(x, "fc1", 64, 32, {biass = false})
loss(mean(h))
