-- expect: 2: require: library names are [a-z0-9_]+
local x = require("../../etc/passwd")
