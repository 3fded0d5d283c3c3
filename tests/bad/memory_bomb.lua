-- expect: 4: memory limit (256 MiB) exceeded
local s = "kiln"
while true do
  s = s .. s
end
