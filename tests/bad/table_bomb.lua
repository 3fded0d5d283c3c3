-- expect: 4: memory limit (256 MiB) exceeded
local t = {}
for i = 1, 1e12 do
  t[i] = i
end
