-- expect: 4: loss: the model already has a loss (at tests/bad/two_losses.lua:3)
local x = input("x", {8, 64})
loss(mean(x))
loss(sum(x))
