-- expect: 4: param: the name opt.m.w is reserved: opt.* is the optimizer's state
-- kiln keeps the AdamW moments of param w as state opt.m.w
local w = param("w", {4}, zeros())
local m = param("opt.m.w", {4}, zeros())
loss(sum(w * m))
