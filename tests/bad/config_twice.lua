-- expect: 3: config: called twice (first at tests/bad/config_twice.lua:2)
local a = config{dim = 64}
local b = config{dim = 32}
