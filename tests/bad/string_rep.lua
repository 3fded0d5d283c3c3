-- expect: 2: memory limit (256 MiB) exceeded
local s = string.rep("x", 1 << 30)
