-- expect: 4: attempt to perform arithmetic on a nil value (local 'n') (called from tests/bad/helper_error.lua:7)
-- a Lua error inside the model's own function names the line that called it
local function width(n)
  return 2 * n + 0
end
local x = input("x", {8, 64})
local w = width(nil)
loss(mean(x))
