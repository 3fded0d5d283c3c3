-- expect: 3: param: the name param.b0 is reserved: param.* is the distributed optimizer's master weight shards
-- --zero 1 keeps the params of bucket 0 as state param.b0
local w = param("param.b0", {4}, zeros())
loss(sum(w))
