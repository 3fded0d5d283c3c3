-- expect: 4: instruction limit (200M) exceeded
local n = 0
while true do
  n = n + 1
end
