-- expect: 2: global 'load'
local f = load("return 1")
