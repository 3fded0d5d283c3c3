-- expect: 3: (error object is a table value)
local x = input("x", {8, 64})
error({code = 42})
