-- expect: 3: duplicate parameter name w (first defined at tests/bad/dup_param.lua:2)
local w1 = param("w", {64, 64}, normal(0.02))
local w2 = param("w", {64, 64}, zeros())
