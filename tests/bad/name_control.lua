-- expect: 2: input: bad character \x0A in a name
local x = input("x\ny", {4})
loss(sum(x))
