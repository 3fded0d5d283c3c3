#!/usr/bin/env bash
# Pretrained weights (issue 17): --init of a Hugging Face GPT-2 file whose
# vocabulary the model pads (wte 255 rows into round_up's 256: the file's
# rows are loaded, the padded row keeps its initial value, the trainer says
# so; other row mismatches stay errors), on one rank and under the
# distributed optimizer (param shards), and layer(i, fn, {prefix=...}) so
# that Hugging Face Llama names ("model.layers.<i>.") load as they are.
# The files are written by Python from a checkpoint of the same model
# trained one step at lr 1e-30 (its params are the initial ones, bit for
# bit); tests/st.py reads and writes them.
. "$(dirname "$0")/lib.sh"
need_corpus
S="--set vocab=255 --set dim=64 --set layers=2 --set heads=2 --set seq=32 --set batch=2"
D="--data $B/corpus.txt"
"$K" compile models/gpt2.lua $S -o "$tmp/g" > /dev/null || { notok "compile gpt2 (vocab 255)"; exit 0; }
"$tmp/g" $D --steps 1 --lr 1e-30 --min-lr 0 --ckpt "$tmp/w0" > /dev/null
W0=$tmp/w0/step_00000001.safetensors
# The "Hugging Face" file: params only, bare names, wte 255 rows (doubled,
# so that loaded rows differ from the initial ones), plus GPT-2's buffers.
python3 tests/st.py hf-gpt2 "$W0" "$tmp/hf.safetensors" 255
python3 tests/st.py hf-gpt2 "$W0" "$tmp/hf192.safetensors" 192

out=$("$tmp/g" $D --steps 1 --lr 1e-30 --min-lr 0 --init "$tmp/hf.safetensors" --ckpt "$tmp/w1" 2>&1 >/dev/null); rc=$?
say $rc "--init of a GPT-2 file with 255 vocabulary rows into the padded 256"
check "it says which rows keep their initial values" \
    "echo \"\$out\" | grep -q 'tensor \"wte.weight\": shape \[255,64\] in the file, \[256,64\] in the model: rows 255..255 keep their initial values'"
check "rows 0..254 are the file's, row 255 the initial one, the rest equal" \
    "python3 tests/st.py expect-padded $tmp/w1/step_00000001.safetensors $W0 255"
check "the check can fail: the initial params are not the loaded ones" \
    "! python3 tests/st.py expect-padded $W0 $W0 255"
err=$("$tmp/g" $D --steps 1 --init "$tmp/hf192.safetensors" 2>&1 >/dev/null); rc=$?
check "192 rows (a multiple of 64, not a padding) is a shape error" \
    "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'tensor \"wte.weight\": shape \[192,64\] in the file, \[256,64\] in the model'"

# The distributed optimizer: the params live in shards of a flat bucket.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$K" compile models/gpt2.lua $S --dp 2 -o "$tmp/g2" > /dev/null
mpirun -np 2 --oversubscribe "$tmp/g2" $D --steps 1 --lr 1e-30 --min-lr 0 --init "$tmp/hf.safetensors" --ckpt "$tmp/w2" > /dev/null 2>"$tmp/err2"
check "--dp 2 (ZeRO-1 param shards): the same params, said once" \
    "python3 tests/st.py expect-padded $tmp/w2/step_00000001.safetensors $W0 255 && [ \$(grep -c 'keep their initial values' $tmp/err2) = 1 ]"

# Hugging Face Llama names: layer(i, fn, {prefix="model.layers."}).
M=tests/models/hf_names.lua
names=$("$K" dump $M --after front | sed -n 's/.*= param {name="\([^"]*\)".*/\1/p' | tr '\n' ' ')
check "layer {prefix=\"model.layers.\"} names params model.layers.<i>.*" \
    "[ \"$names\" = 'model.embed_tokens.weight model.layers.0.mlp.up_proj.weight model.layers.1.mlp.up_proj.weight model.norm.weight lm_head.weight ' ]"
names=$("$K" dump $M --set hf=0 --after front | sed -n 's/.*= param {name="\([^"]*\)".*/\1/p' | tr '\n' ' ')
check "layer {prefix=false}: names as given (the model writes them in full)" \
    "[ \"$names\" = 'model.embed_tokens.weight layers.0.up layers.1.up model.norm.weight lm_head.weight ' ]"
"$K" compile $M -o "$tmp/l" > /dev/null
"$tmp/l" $D --steps 1 --lr 1e-30 --min-lr 0 --ckpt "$tmp/l0" > /dev/null
python3 tests/st.py params-only "$tmp/l0/step_00000001.safetensors" "$tmp/llama.safetensors" 2
"$tmp/l" $D --steps 1 --lr 1e-30 --min-lr 0 --init "$tmp/llama.safetensors" --ckpt "$tmp/l1" > /dev/null
check "a file with Hugging Face Llama names loads with --init (params doubled, read back)" \
    "python3 tests/st.py expect-scaled $tmp/l1/step_00000001.safetensors $tmp/l0/step_00000001.safetensors 2"
for bad in '{prefix=3}:prefix must be a string or false' '{prefx="a."}:unknown option prefx'; do
    opt=${bad%%:*} want=${bad#*:}
    printf 'config{}\nlayer(0, function() end, %s)\n' "$opt" > "$tmp/bad.lua"
    err=$("$K" dump "$tmp/bad.lua" 2>&1); rc=$?
    check "layer $opt: one line naming the model's line" \
        "[ $rc -ne 0 ] && [ \$(echo \"\$err\" | wc -l) = 1 ] && echo \"\$err\" | grep -q 'bad.lua:2: layer: $want'"
done

# kiln sample: the checkpoint's --set values (metadata "sets") apply, a
# --set given to sample overrides them.
"$K" compile models/tiny.lua --set dim=32 --set heads=2 -o "$tmp/t32" > /dev/null
"$tmp/t32" $D --steps 1 --ckpt "$tmp/t32ck" > /dev/null
C=$tmp/t32ck/step_00000001.safetensors
out=$("$K" sample "$C" --prompt "ab" --tokens 5 2>&1); rc=$?
check "sample rebuilds the model with the checkpoint's --set dim=32 heads=2 (rc=$rc)" "[ $rc = 0 ] && [ \${#out} = 7 ]"
err=$("$K" sample "$C" --set dim=64 --prompt "ab" --tokens 5 2>&1); rc=$?
check "a --set given to sample overrides the checkpoint's (dim=64: a shape error)" \
    "[ $rc = 1 ] && echo \"\$err\" | grep -q 'shape \[256,32\] in the file, \[256,64\] in the model'"

# GPT-2's BPE: a model with GPT-2's vocabulary samples BPE tokens.  The
# weights make the logits 10 at " hello" (23748) and 0 elsewhere, so greedy
# sampling must print " hello" per token; bytes would print byte 0 instead.
G=$B/gpt2-bpe
[ -s "$G/encoder.json" ] || tools/fetch-gpt2-bpe.sh "$G"
S2="--set vocab=50257 --set dim=32 --set layers=1 --set heads=2 --set seq=16 --set batch=1"
"$K" compile models/gpt2.lua $S2 -o "$tmp/gb" > /dev/null
"$tmp/gb" $D --steps 1 --ckpt "$tmp/gbck" > /dev/null
python3 tests/st.py constant "$tmp/gbck/step_00000001.safetensors" "$tmp/hello.safetensors" 23748
out=$("$K" sample "$tmp/hello.safetensors" --model models/gpt2.lua $S2 --bpe "$G" --prompt "The" --tokens 3 --temperature 0 2>&1); rc=$?
check "a 50257-token vocabulary samples GPT-2 BPE: \"$out\"" "[ $rc = 0 ] && [ \"\$out\" = 'The hello hello hello' ]"
out=$("$K" sample "$tmp/gbck/step_00000001.safetensors" --bpe "$G" --prompt "The" --tokens 3 --seed 1 2>&1); rc=$?
check "... from the trained checkpoint's metadata alone (rc=$rc)" "[ $rc = 0 ] && [ \"\${out:0:3}\" = The ]"
bytes=$("$K" sample "$tmp/hello.safetensors" --model models/gpt2.lua $S2 --tokenizer bytes --prompt "The" --tokens 3 --temperature 0 | wc -c)
check "--tokenizer bytes: the prompt and 3 bytes ($bytes)" "[ $bytes = 6 ]"
err=$("$K" sample "$tmp/hello.safetensors" --model models/gpt2.lua $S2 --bpe "$tmp/none" --prompt "The" 2>&1); rc=$?
check "no tokenizer files: one line naming --bpe" "[ $rc = 1 ] && [ \$(echo \"\$err\" | wc -l) = 1 ] && echo \"\$err\" | grep -q -- '--bpe: .*encoder.json'"
