#!/usr/bin/env bash
# kiln sample: train tiny briefly with a checkpoint, then generate from it.
# The output is the prompt and exactly N bytes (stdout is a pipe); a seed
# repeats; greedy (--temperature 0) and --top-k 1 ignore the seed; the
# trained model writes mostly lowercase letters and spaces (like its corpus),
# far more than a one-step model; each bad input is one line and exit 1.
# KILN=path overrides the kiln binary.
. "$(dirname "$0")/lib.sh"
K=${KILN:-$B/kiln}
need_corpus
"$B/kiln" compile models/tiny.lua --steps 300 -o "$tmp/tiny" > /dev/null
"$tmp/tiny" --data "$B/corpus.txt" --ckpt "$tmp/ck" > /dev/null
"$tmp/tiny" --data "$B/corpus.txt" --ckpt "$tmp/ck1" --steps 1 > /dev/null
C=$tmp/ck/step_00000300.safetensors C1=$tmp/ck1/step_00000001.safetensors
S() { "$K" sample "$@" 2> "$tmp/err"; }

S "$C" --prompt "The " --tokens 100 --seed 1 > "$tmp/a"; rc=$?
check "sample exits 0 (rc=$rc)" "[ $rc = 0 ]"
check "the output is the prompt and 100 bytes ($(wc -c < "$tmp/a") bytes)" \
    "[ \$(wc -c < $tmp/a) = 104 ] && [ \"\$(head -c 4 $tmp/a)\" = 'The ' ]"
S "$C" --prompt "The " --tokens 100 --seed 1 > "$tmp/b"
S "$C" --prompt "The " --tokens 100 --seed 2 > "$tmp/c"
check "the same seed gives the same sample" "cmp -s $tmp/a $tmp/b"
check "another seed gives another sample" "! cmp -s $tmp/a $tmp/c"
S "$C" --prompt "The " --tokens 60 --temperature 0 --seed 1 > "$tmp/g1"
S "$C" --prompt "The " --tokens 60 --temperature 0 --seed 2 > "$tmp/g2"
S "$C" --prompt "The " --tokens 60 --top-k 1 --seed 3 > "$tmp/k1"
check "greedy (--temperature 0) does not depend on the seed" "[ \$(wc -c < $tmp/g1) = 64 ] && cmp -s $tmp/g1 $tmp/g2"
check "--top-k 1 is greedy" "cmp -s $tmp/g1 $tmp/k1"
S "$C" --prompt "" --tokens 20 --top-k 5 > "$tmp/e"; rc=$?
check "an empty prompt works (rc=$rc)" "[ $rc = 0 ] && [ \$(wc -c < $tmp/e) = 20 ]"

# lowercase letters and spaces: ~89% of the corpus, ~10% of uniform bytes
share() { tail -c +5 "$1" | tr -cd 'a-z ' | wc -c; }
S "$C" --prompt "The " --tokens 300 --temperature 0.8 --seed 1 > "$tmp/t"
S "$C1" --prompt "The " --tokens 300 --temperature 0.8 --seed 1 > "$tmp/u"
st=$(share "$tmp/t") su=$(share "$tmp/u")
check "the trained model writes mostly lowercase and spaces ($st of 300 > 210)" "[ $st -gt 210 ]"
check "the one-step model does much worse ($su of 300 < $st / 2)" "[ $((su * 2)) -lt $st ]"

# bad input: one line on stderr, nothing on stdout, exit 1
bad() { # name, expected text, args...
    local name=$1 want=$2; shift 2
    "$K" sample "$@" > "$tmp/out" 2> "$tmp/err"; local rc=$?
    check "$name: one line, exit 1 ($(head -c 150 "$tmp/err"))" \
        "[ $rc = 1 ] && [ \$(wc -l < $tmp/err) = 1 ] && [ ! -s $tmp/out ] && grep -qF -- '$want' $tmp/err"
}
bad "missing checkpoint" "cannot open" "$tmp/nope.safetensors" --prompt x
head -c 3000 "$C" > "$tmp/trunc.safetensors"
bad "truncated checkpoint" "trunc.safetensors:" "$tmp/trunc.safetensors" --prompt x
LC_ALL=C sed 's/"model":"tiny"/"model":"tinx"/' "$C" > "$tmp/unknown.safetensors"
bad "unknown model" 'unknown model "tinx"' "$tmp/unknown.safetensors" --prompt x
grep -v 'output("logits"' models/tiny.lua > "$tmp/nologits.lua"
bad "a model without a logits output" 'has no output("logits", ...)' "$C" --model "$tmp/nologits.lua" --prompt x
bad "negative --tokens" "--tokens" "$C" --prompt x --tokens -5
bad "negative --temperature" "--temperature" "$C" --prompt x --temperature -1
bad "a --set that differs from training" "[256,64]" "$C" --prompt x --set dim=32
bad "no --prompt" "--prompt" "$C"
