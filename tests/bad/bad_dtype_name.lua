-- expect: 2: input: unknown dtype 'float32'
local x = input("x", {8, 64}, "float32")
