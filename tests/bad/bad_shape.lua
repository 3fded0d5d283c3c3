-- expect: 2: param: dim 2 of the shape is 0
local w = param("w", {64, 0}, normal(0.02))
