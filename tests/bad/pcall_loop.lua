-- expect: 5: instruction limit (200M) exceeded
-- pcall cannot swallow the limit: once hit, every instruction raises
while true do
  pcall(function()
    while true do end
  end)
end
