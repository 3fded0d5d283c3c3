-- expect: 2: require: no library 'nosuchlib'
local x = require("nosuchlib")
