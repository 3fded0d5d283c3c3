#!/usr/bin/env bash
# Loss masks and the inputs the trainer feeds (issue 17).
#
# A masked mean loss(sum(ce * m) / (sum(m) + 1e-30)) over the input
# loss_mask: kiln check (whose loss_mask is 0/1, the first quarter of the
# rows and of every row 0, so ranks hold different counts and at --dp 4 one
# holds none) gives the single-device loss and gradients under --dp 2,
# --dp 4, --micro-batches 2, --cp 2 (allgather and p2p) and dp x cp (f64,
# its own tolerance), also written as sum(ce * m / (sum(m) + eps)); the
# count broadcast before the division is refused; the mask changes the loss
# (so a mask ignored would be seen).  The trainer's --ignore-index ID feeds loss_mask = (targets != ID):
# the compiled trainer equals kiln run --interp step for step (rel 1e-5),
# the mask changes the losses, a mask that is 0 everywhere gives loss 0 (no
# NaN), and mpirun -np 2 (dp 2, and cp 2 with p2p) equals one rank (rel
# 1e-5).  --loss-mask FILE, a shard of weights aligned with the data (0 at
# spaces), gives the --ignore-index 32 losses bit for bit on one rank and
# under mpirun; shifted by one token it gives others; misaligned, an error.  A model input the trainer never feeds is refused by kiln compile
# and kiln run at the model's line; kiln check keeps accepting it.
. "$(dirname "$0")/lib.sh"

cat > "$tmp/mask.lua" <<'EOF'
local nn = require "nn"
local c = config{vocab = 256, dim = 16, layers = 1, heads = 2, seq = 16, batch = 4, lr = 1e-2, warmup = 0}
local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local m = input("loss_mask", {c.batch, c.seq}, "f32")
local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02))
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))
x = layer(0, function() return nn.gpt_block(x, c) end)
local logits = matmul(nn.layernorm(x, "ln_f"), wte, {tb = true})
local ce = cross_entropy(logits, targets)
loss(sum(ce * m) / (sum(m) + 1e-30))
EOF
sed 's|^loss(.*|loss(mean(ce))|' "$tmp/mask.lua" > "$tmp/plain.lua"

# ---- kiln check: sharded == single device ----
for o in "" "--dp 2" "--dp 4" "--micro-batches 2" "--cp 2" "--cp 2 --cp-comm p2p" "--dp 2 --cp 2" \
    "--dp 2 --micro-batches 2 --cp 2 --cp-comm p2p"; do
    out=$("$K" check "$tmp/mask.lua" $o 2>&1)
    rc=$?
    check "masked loss: kiln check $o: $(echo "$out" | tail -1 | sed 's/.*; //')" "[ $rc = 0 ] && echo \"\$out\" | grep -q ' 0 mismatched'"
done
sed 's|^loss(.*|loss(sum(ce * m / (sum(m) + 1e-30)))|' "$tmp/mask.lua" > "$tmp/bc.lua"
out=$("$K" check "$tmp/bc.lua" --dp 2 --cp 2 2>&1)
check "the count guarded as a scalar, then broadcast: kiln check --dp 2 --cp 2 ($(echo "$out" | tail -1 | sed 's/.*; //'))" \
    "echo \"\$out\" | grep -q ' 0 mismatched'"
sed 's|^loss(.*|loss(sum(ce * m / sum(m)))|' "$tmp/mask.lua" > "$tmp/bc2.lua"
out=$("$K" check "$tmp/bc2.lua" --dp 2 2>&1)
check "the partial count broadcast before the division: refused at its line ($out)" \
    "echo \"\$out\" | grep -q 'bc2.lua:12: div cannot be split over the batch.*a partial sum goes through a non-linear op'"
a=$("$K" check "$tmp/mask.lua" | sed -n 's/.*loss f32 \([^ ]*\) .*/\1/p')
b=$("$K" check "$tmp/plain.lua" | sed -n 's/.*loss f32 \([^ ]*\) .*/\1/p')
check "the mask changes the loss ($a masked, $b plain mean), so a dropped mask would be seen" \
    "[ -n '$a' ] && [ -n '$b' ] && awk 'BEGIN {d = $a - $b; exit !(d > 1e-3 || d < -1e-3)}'"

# ---- the trainer: --ignore-index ----
head -c 20000 /usr/share/common-licenses/GPL-3 > "$tmp/d.txt"
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
maxrel() { paste <($1) <($2) | awk 'NF != 2 {bad = 1} {d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (s > 0 && d / s > m) m = d / s; k++}
    END {if (bad || k == 0) print 1; else printf "%g\n", m}'; }
close() { awk -v x="$1" 'BEGIN {exit !(x <= 1e-5)}'; }
R="--data $tmp/d.txt --steps 8 --print-every 100"
"$K" compile "$tmp/mask.lua" -o "$tmp/t1" > /dev/null
"$tmp/t1" $R --ignore-index 32 --log "$tmp/c32" > /dev/null
"$K" run "$tmp/mask.lua" --interp $R --ignore-index 32 --log "$tmp/i32" > /dev/null
r=$(maxrel "losses $tmp/c32" "losses $tmp/i32")
check "--ignore-index 32: compiled trainer == interpreter over 8 steps (max rel diff $r)" "[ \$(wc -l < $tmp/c32) = 8 ] && close $r"
"$tmp/t1" $R --log "$tmp/c" > /dev/null
r=$(maxrel "losses $tmp/c" "losses $tmp/c32")
check "--ignore-index 32 changes the losses (max rel diff $r > 1e-3 against no mask)" "awk -v x=$r 'BEGIN {exit !(x > 1e-3)}'"
"$K" run "$tmp/mask.lua" $R --ignore-index 32 --log "$tmp/j32" > /dev/null
check "kiln run (JIT) passes --ignore-index on: the compiled trainer's losses" "cmp -s <(losses $tmp/c32) <(losses $tmp/j32)"
head -c 2000 /dev/zero | tr '\0' 'a' > "$tmp/a.txt"
"$tmp/t1" --data "$tmp/a.txt" --steps 2 --ignore-index 97 --log "$tmp/z" > "$tmp/zo" 2>&1
check "a mask 0 everywhere: loss 0 and grad-norm 0, no NaN" "[ \$(grep -c '\"loss\":0,.*\"grad_norm\":0,' $tmp/z) = 2 ]"
grep -v '"loss_mask"' "$tmp/plain.lua" > "$tmp/nomask.lua"
"$K" compile "$tmp/nomask.lua" -o "$tmp/p1" > /dev/null
out=$("$tmp/p1" $R --ignore-index 32 2>&1)
rc=$?
check "--ignore-index on a model without loss_mask: one line, exit 1 ($out)" "[ $rc = 1 ] && [ \$(echo \"\$out\" | wc -l) = 1 ] && echo \"\$out\" | grep -q 'has no input loss_mask'"

# ---- the trainer: --loss-mask, a stream of weights aligned with the data ----
# mkmask DATA OUT SHIFT: an llm.c shard (version 1) of weights, 0 where the
# data's byte is a space, 1 elsewhere, rotated by SHIFT positions
mkmask() { python3 - "$@" <<'PY'
import struct, sys
data = open(sys.argv[1], 'rb').read()
s = int(sys.argv[3])
w = [0 if b == 32 else 1 for b in data]
w = w[s:] + w[:s]
with open(sys.argv[2], 'wb') as f:
    f.write(struct.pack('<256i', 20240520, 1, len(w), *([0] * 253)))
    f.write(struct.pack('<%dH' % len(w), *w))
PY
}
mkmask "$tmp/d.txt" "$tmp/m.bin" 0
mkmask "$tmp/d.txt" "$tmp/m1.bin" 1
"$tmp/t1" $R --loss-mask "$tmp/m.bin" --log "$tmp/w" > /dev/null
check "--loss-mask (weights 0 at spaces) == --ignore-index 32, bit for bit" "[ \$(wc -l < $tmp/w) = 8 ] && cmp -s <(losses $tmp/w) <(losses $tmp/c32)"
"$tmp/t1" $R --loss-mask "$tmp/m1.bin" --log "$tmp/w1" > /dev/null
r=$(maxrel "losses $tmp/w1" "losses $tmp/c32")
check "the weights shifted by one token give other losses (max rel diff $r > 1e-3), so the alignment is checked" "awk -v x=$r 'BEGIN {exit !(x > 1e-3)}'"
head -c 1000 "$tmp/d.txt" > "$tmp/short.txt"
mkmask "$tmp/short.txt" "$tmp/short.bin" 0
out=$("$tmp/t1" $R --loss-mask "$tmp/short.bin" 2>&1)
rc=$?
check "--loss-mask not aligned with --data: one line, exit 1 ($out)" "[ $rc = 1 ] && echo \"\$out\" | grep -q 'holds 1000 weights, --data holds 20000 tokens'"

# ---- MPI: 2 ranks == 1 rank ----
if command -v mpirun > /dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    for o in "--dp 2" "--cp 2 --cp-comm p2p"; do
        "$K" compile "$tmp/mask.lua" $o -o "$tmp/t2" > /dev/null
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun -np 2 --oversubscribe \
            "$tmp/t2" $R --ignore-index 32 --log "$tmp/m2" > /dev/null 2>&1
        r=$(maxrel "losses $tmp/c32" "losses $tmp/m2")
        check "mpirun -np 2 ($o) --ignore-index 32 == 1 rank over 8 steps (max rel diff $r)" "[ \$(wc -l < $tmp/m2) = 8 ] && close $r"
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 120 mpirun -np 2 --oversubscribe \
            "$tmp/t2" $R --loss-mask "$tmp/m.bin" --log "$tmp/m2w" > /dev/null 2>&1
        r=$(maxrel "losses $tmp/c32" "losses $tmp/m2w")
        check "mpirun -np 2 ($o) --loss-mask == 1 rank --ignore-index 32 over 8 steps (max rel diff $r)" "[ \$(wc -l < $tmp/m2w) = 8 ] && close $r"
    done
else
    notok "mpirun is not installed (make test installs Open MPI: tools/deps.sh)"
fi

# ---- inputs the trainer never feeds ----
sed 's|^local m = input.*|&\nlocal extra = input("extra", {c.batch, c.seq}, "f32")|; s|^loss(.*|loss(sum(ce * m * extra) / (sum(m) + 1e-30))|' \
    "$tmp/mask.lua" > "$tmp/extra.lua"
for cmd in "compile $tmp/extra.lua -o $tmp/x" "run $tmp/extra.lua --data $tmp/d.txt --steps 1" \
    "run $tmp/extra.lua --interp --data $tmp/d.txt --steps 1"; do
    out=$("$K" $cmd 2>&1)
    rc=$?
    check "kiln ${cmd%% *} of a model with input extra: refused at its line ($out)" \
        "[ $rc != 0 ] && [ \"\$out\" = '$tmp/extra.lua:6: input extra: the trainer feeds only tokens, targets and loss_mask (kiln check feeds any input)' ]"
done
check "kiln check still accepts input extra (it feeds every input)" "\"$K\" check $tmp/extra.lua > /dev/null 2>&1"
sed 's|"loss_mask", {c.batch, c.seq}, "f32"|"loss_mask", {c.batch}, "f32"|; s|^loss(.*|loss(mean(ce) + sum(m))|' "$tmp/mask.lua" > "$tmp/badm.lua"
out=$("$K" compile "$tmp/badm.lua" -o "$tmp/x" 2>&1)
check "a loss_mask not shaped like targets: refused at its line ($out)" "echo \"\$out\" | grep -q 'badm.lua:5: input loss_mask: the trainer feeds it as f32 shaped like targets'"
