-- expect: 4: string.find: pattern matching is not available
-- backtracking runs in C, where the instruction limit cannot stop it
local s = string.rep("a", 5000)
local i = s:find(".-.-.-.-b")
