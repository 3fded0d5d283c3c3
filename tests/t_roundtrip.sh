#!/usr/bin/env bash
# parse(dump(m)) == m for every model after every stage of the pipeline: the
# dump, read back by `kiln dump FILE.ir`, re-dumps byte-identically (the C
# unit tests check ir_module_equal on the same round trip).  Also --format dot.
. "$(dirname "$0")/lib.sh"
LLAMA_SMALL="--set layers=2 --set dim=64 --set heads=4 --set kv_heads=2 --set ffn=128 --set vocab=256 --set seq=32 --set batch=2"
for spec in "tiny:models/tiny.lua:" "gpt2:models/gpt2.lua:" "llama:models/llama.lua:$LLAMA_SMALL"; do
    IFS=: read -r name file sets <<< "$spec"
    for pass in front autodiff optimizer fuse schedule memplan; do
        # shellcheck disable=SC2086
        "$K" dump "$file" --after $pass $sets -o "$tmp/a.ir" && "$K" dump "$tmp/a.ir" -o "$tmp/b.ir"
        check "round trip $name after $pass" "cmp -s $tmp/a.ir $tmp/b.ir"
    done
done
"$K" dump models/tiny.lua --format dot -o "$tmp/t.dot"
check "dot output is a digraph with matmuls" "head -1 $tmp/t.dot | grep -q digraph && grep -q matmul $tmp/t.dot"
