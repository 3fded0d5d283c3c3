-- expect: 3: param: name 'w...' contains a NUL byte
-- "w\0a" and "w\0b" are two names to Lua but the same to C
local a = param("w\0a", {4}, zeros())
local b = param("w\0b", {4}, zeros())
loss(sum(a + b))
