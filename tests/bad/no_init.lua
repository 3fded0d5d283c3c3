-- expect: 2: param: w needs an init: normal(std), zeros() or ones()
local w = param("w", {64, 64})
