-- expect: 3: time limit (1 s) exceeded
-- run by tests/t_dsl.sh with --frontend-timeout 1: the time goes to single C calls the instruction hook cannot see
local function f(n, ...) if n == 0 then return select("#", ...) end return f(n - 1, 1, 2, 3, 4, 5, 6, 7, 8, ...) end for i = 1, 1e9 do f(20000) end
