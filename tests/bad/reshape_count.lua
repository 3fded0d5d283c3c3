-- expect: 3: reshape: cannot reshape f32[8,64] to [3,-1]
local x = input("x", {8, 64})
local y = reshape(x, {3, -1})
