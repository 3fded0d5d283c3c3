-- expect: 3: global 'os'
-- the sandbox has no os library
os.execute("touch /tmp/kiln_sandbox_escaped")
