-- expect: 6: matmul:
-- the bad matmul is built inside models/lib/nn.lua; the error names this line
local nn = require "nn"
local x = input("x", {8, 64})
local h = nn.linear(x, "fc1", 64, 32)
local y = nn.linear(h, "fc2", 64, 16)
loss(mean(y))
