-- expect: 2: global 'io'
local f = io.open("/etc/passwd")
print(f:read("a"))
