-- expect: 3: input: the name trainer.step is reserved: trainer.* is the checkpoint's trainer state
-- checkpoints hold the trainer's step as trainer.step
local x = input("trainer.step", {4})
loss(sum(x))
