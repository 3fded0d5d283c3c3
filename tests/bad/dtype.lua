-- expect: 5: embedding: ids must be i32 or i64, got f32
local wte = param("wte", {256, 64}, normal(0.02))
local ids = input("ids", {8, 16}) -- f32 by default
-- ids must be integers
local x = embedding(wte, ids)
loss(mean(x))
