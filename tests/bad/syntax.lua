-- expect: 4: unexpected symbol
local c = config{dim = 64}
local x = input("x", {8, c.dim})
local y = = x
