-- expect: 5: concat: needs 1 to 256 tensors, got 257
local x = input("x", {2, 3})
local parts = {}
for i = 1, 257 do parts[i] = x end
local y = concat(parts, 1)
loss(mean(y))
