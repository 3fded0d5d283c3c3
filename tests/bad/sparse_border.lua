-- expect: 5: table.insert/remove: table longer than
-- 82 entries whose border #t is 2^40 + 1
local t = {}
for i = 0, 40 do t[1 << i] = true; t[(1 << i) + 1] = true end
table.insert(t, 1, false)
