-- expect: 3: param: the name __metadata__ is reserved: __metadata__ is the safetensors header
-- a checkpoint tensor of this name would be read as the safetensors header
local w = param("__metadata__", {4}, zeros())
loss(sum(w))
