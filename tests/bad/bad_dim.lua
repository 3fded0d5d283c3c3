-- expect: 3: sum: dim 3 out of range for a rank-2 tensor
local x = input("x", {8, 64})
local y = sum(x, 3)
