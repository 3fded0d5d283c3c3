-- expect: 3: tensor has no field 'size'
local x = input("x", {8, 64})
local n = x.size
