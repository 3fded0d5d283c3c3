-- expect: 5: time limit (1 s) exceeded
-- run by tests/t_dsl.sh with --frontend-timeout 1: the time goes to single C calls the instruction hook cannot see
local t = {}
for i = 1, 1 << 22 do t[i] = i end
for i = 1, 1e9 do table.insert(t, 1, i) end
