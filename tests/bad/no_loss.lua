-- expect: 3: the model has no loss(x)
local x = input("x", {8, 64})
local y = x * 2
