-- expect: 3: global 'frobnicate'
local x = input("x", {8, 64})
local y = frobnicate(x)
loss(mean(y))
