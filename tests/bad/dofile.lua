-- expect: 2: global 'dofile'
dofile("/etc/passwd")
