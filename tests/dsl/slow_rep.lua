-- expect: 4: time limit (1 s) exceeded
-- run by tests/t_dsl.sh with --frontend-timeout 1: the time goes to single C calls the instruction hook cannot see
local s = 0
for i = 1, 1e9 do s = s + #string.rep("x", 1 << 26) end
