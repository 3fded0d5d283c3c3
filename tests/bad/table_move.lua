-- expect: 3: table.move: more than
-- moving absent keys allocates nothing: only the element bound stops it
table.move({}, 1, 1e15, 1, {})
