-- expect: 3: table.insert/remove: tables with a __len metamethod
local t = setmetatable({}, {__len = function() return 1e15 end})
table.remove(t, 1)
