-- expect: 3: slice: 60..70 out of range for dim 2 of f32[8,64]
local x = input("x", {8, 64})
local y = slice(x, 2, 60, 70)
