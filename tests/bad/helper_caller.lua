-- expect: 7: ; called from tests/bad/helper_caller.lua:11)
-- an error inside nn.linear inside the model's own function inside layer():
-- it names the helper's line, the parameter and every model line on the way
local nn = require "nn"
local x = input("x", {8, 64})
local function block(h, i)
  local y = nn.linear(h, "fc", 64 - i, 64)
  return y
end
for i = 0, 1 do
  x = layer(i, function() local y = block(x, i); return y end)
end
loss(mean(x))
