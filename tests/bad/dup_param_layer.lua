-- expect: 5: duplicate parameter name h.3.ln.weight
local x = input("x", {8, 64})
layer(3, function()
  local a = param("ln.weight", {64}, ones())
  local b = param("ln.weight", {64}, ones())
end)
