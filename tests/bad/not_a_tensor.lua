-- expect: 3: gelu: argument 1 must be a tensor, got table
local x = input("x", {8, 64})
local y = gelu({x})
