-- expect: 3: attempt to perform arithmetic on a nil value (field 'dimm')
local c = config{dim = 64}
local h = c.dimm * 4
