#!/usr/bin/env bash
# parse(dump(m)) == m for every model after every stage of the pipeline: the
# dump, read back by `kiln dump FILE.ir`, re-dumps byte-identically (the C
# unit tests check ir_module_equal on the same round trip).  Also --format dot.
# Each case writes fresh files and both dumps must succeed: a failed dump
# cannot leave an earlier case's files to compare.
. "$(dirname "$0")/lib.sh"
LLAMA_SMALL="--set layers=2 --set dim=64 --set heads=4 --set kv_heads=2 --set ffn=128 --set vocab=256 --set seq=32 --set batch=2"
for spec in "tiny:models/tiny.lua:" "gpt2:models/gpt2.lua:" "llama:models/llama.lua:$LLAMA_SMALL"; do
    IFS=: read -r name file sets <<< "$spec"
    for pass in front autodiff optimizer fuse schedule memplan; do
        a=$tmp/$name.$pass.ir b=$tmp/$name.$pass.back.ir
        # shellcheck disable=SC2086
        "$K" dump "$file" --after $pass $sets -o "$a" && "$K" dump "$a" -o "$b"
        check "round trip $name after $pass" "[ $? = 0 ] && [ -s '$a' ] && cmp -s '$a' '$b'"
    done
done
"$K" dump models/tiny.lua --format dot -o "$tmp/t.dot"
check "dot output is a digraph with matmuls" "[ $? = 0 ] && head -1 $tmp/t.dot | grep -q digraph && grep -q matmul $tmp/t.dot"
# the comparison can fail: a dump that fails (an unknown pass) leaves no file to pass on
"$K" dump models/tiny.lua --after nosuchpass -o "$tmp/x.ir" 2> /dev/null && "$K" dump "$tmp/x.ir" -o "$tmp/x.back.ir" 2> /dev/null
check "(planted) a failed dump fails its case" "! { [ $? = 0 ] && [ -s '$tmp/x.ir' ] && cmp -s '$tmp/x.ir' '$tmp/x.back.ir'; }"
