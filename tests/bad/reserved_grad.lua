-- expect: 4: output: the name grad:w is reserved
-- autodiff names the gradient of param w output grad:w
local w = param("w", {4}, zeros())
output("grad:w", w)
loss(sum(w))
