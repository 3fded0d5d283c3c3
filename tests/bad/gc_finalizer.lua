-- expect: 3: setmetatable: __gc finalizers are not allowed
-- finalizers run with hooks off, so a loop in one would never be stopped
local t = setmetatable({}, {__gc = function() while true do end end})
collectgarbage()
