#!/usr/bin/env bash
# Pipeline parallel through the back end and the compiled trainer under mpirun
# (issue 18): one program table per stage, each rank running its stage's
# (kiln_rt.h, rt_program.stages), checkpoints that stay logical across pp.
#
# `kiln compile --pp N` trainers on N (x dp) ranks give the 1-rank loss curve
# over 30 steps (relative 1e-5: f32, only the summation order differs) for
# every schedule, tied (GPT) and untied (Llama) embeddings, with dp, and
# through `kiln run` (the JIT); a checkpoint saved at pp 2 holds the same
# tensors as the pp 1 one (every param and state once, the stages' parts
# gathered) and resumes at pp 1, at pp 4 and the reverse with the losses of
# continuing, and kiln sample reads it; --init loads a pp 1 file into the
# stages; a loss mask (an input of the last stage only) with --ignore-index
# and --val gives the 1-rank losses; a wrong process count is one line.
. "$(dirname "$0")/lib.sh"
need_mpi
GPT4="models/tiny.lua --set layers=4 --steps 30"
GPT8="models/tiny.lua --set layers=8 --set dim=32 --set heads=2 --steps 30"
LLAMA="models/llama.lua --set vocab=256 --set dim=64 --set layers=2 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=8 --steps 30"
comp() { # out flags...
    local o=$1; shift
    "$K" compile "$@" -o "$tmp/$o" > /dev/null 2> "$tmp/$o.err" || echo "# compile $o: $(head -1 "$tmp/$o.err")"
}
# the tensors of a checkpoint, "name dtype shape" sorted (the safetensors header)
tensors() {
    python3 -c 'import json, struct, sys
b = open(sys.argv[1], "rb").read(); h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]]); h.pop("__metadata__", None)
print("\n".join(sorted("%s %s %s" % (k, v["dtype"], v["shape"]) for k, v in h.items())))' "$1"
}

comp g4 $GPT4
comp g8 $GPT8
comp ll $LLAMA
comp pp2 $GPT4 --pp 2 --micro-batches 2
comp ll2 $LLAMA --pp 2 --micro-batches 4
comp pp2dp2 $GPT4 --pp 2 --dp 2 --micro-batches 2
for s in 1f1b zb-h1; do comp pp4$s $GPT4 --pp 4 --micro-batches 4 --pp-schedule $s; done
comp pp4interleaved $GPT8 --pp 4 --vpp 2 --micro-batches 4 --pp-schedule interleaved
comp pp4zb-v $GPT8 --pp 4 --micro-batches 4 --pp-schedule zb-v
for m in g4 g8 ll; do "$tmp/$m" $D --log "$tmp/$m.log" > /dev/null; done

$MPI -np 2 "$tmp/pp2" $D --log "$tmp/pp2.log" > /dev/null 2>&1
check "GPT --pp 2 (1f1b, tied wte), mpirun -np 2 == 1 rank over 30 steps (worst $(worst "$tmp/pp2.log" "$tmp/g4.log"))" \
    "same $tmp/pp2.log $tmp/g4.log 30"
$MPI -np 2 "$K" run $GPT4 --pp 2 --micro-batches 2 $D --log "$tmp/jit.log" > /dev/null 2>&1
check "kiln run (JIT) --pp 2, mpirun -np 2 == 1 rank (worst $(worst "$tmp/jit.log" "$tmp/g4.log"))" "same $tmp/jit.log $tmp/g4.log 30"
$MPI -np 2 "$tmp/ll2" $D --log "$tmp/ll2.log" > /dev/null 2>&1
check "Llama --pp 2 (4 micro-batches), mpirun -np 2 == 1 rank (worst $(worst "$tmp/ll2.log" "$tmp/ll.log"))" "same $tmp/ll2.log $tmp/ll.log 30"
for s in 1f1b zb-h1 interleaved zb-v; do
    ref=g4; [ $s = interleaved ] || [ $s = zb-v ] && ref=g8
    $MPI -np 4 "$tmp/pp4$s" $D --log "$tmp/pp4$s.log" > /dev/null 2>&1
    check "GPT --pp 4 --pp-schedule $s, mpirun -np 4 == 1 rank (worst $(worst "$tmp/pp4$s.log" "$tmp/$ref.log"))" \
        "same $tmp/pp4$s.log $tmp/$ref.log 30"
done
$MPI -np 4 "$tmp/pp2dp2" $D --log "$tmp/pp2dp2.log" > /dev/null 2>&1
check "GPT --pp 2 --dp 2 (zero 1), mpirun -np 4 == 1 rank (worst $(worst "$tmp/pp2dp2.log" "$tmp/g4.log"))" "same $tmp/pp2dp2.log $tmp/g4.log 30"
# the comparison can fail: another learning rate gives another curve
"$tmp/g4" $D --lr 0.01 --log "$tmp/lx" > /dev/null
check "the comparison tells curves apart (another --lr: worst $(worst "$tmp/lx" "$tmp/g4.log"))" "! same $tmp/lx $tmp/g4.log 30"

# checkpoints: 20 steps straight vs 10 + 10 across pp
"$tmp/g4" $D --steps 20 --log "$tmp/s20" > /dev/null
tail -10 "$tmp/s20" > "$tmp/s20t"
$MPI -np 2 "$tmp/pp2" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/c2" > /dev/null 2>&1
"$tmp/g4" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/c1" > /dev/null
$MPI -np 4 "$tmp/pp2dp2" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/c22" > /dev/null 2>&1
F=step_00000010.safetensors
tensors "$tmp/c1/$F" > "$tmp/t1"
tensors "$tmp/c2/$F" > "$tmp/t2"
tensors "$tmp/c22/$F" > "$tmp/t22"
$MPI -np 2 -x KILN_RT_COMM_CHUNK=1000 "$tmp/pp2" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/c2k" > /dev/null 2>&1
check "the stages' tensors sent to rank 0 in pieces of 1000 bytes (KILN_RT_COMM_CHUNK): the same file byte for byte" \
    "cmp -s $tmp/c2k/step_00000010.safetensors $tmp/c2/step_00000010.safetensors"
check "the pp 2 and pp 2 x dp 2 checkpoints hold the pp 1 one's $(wc -l < "$tmp/t1") tensors, each once (names, dtypes, shapes)" \
    "[ -s $tmp/t1 ] && cmp -s $tmp/t1 $tmp/t2 && cmp -s $tmp/t1 $tmp/t22"
"$tmp/g4" $D --steps 20 --resume "$tmp/c2" --ckpt "$tmp/r21" --log "$tmp/r21.log" > /dev/null 2>&1
check "pp 2 checkpoint resumed at pp 1 == continuing (worst $(worst "$tmp/r21.log" "$tmp/s20t"))" "same $tmp/r21.log $tmp/s20t 10"
$MPI -np 2 "$tmp/pp2" $D --steps 20 --resume "$tmp/c1" --ckpt "$tmp/r12" --log "$tmp/r12.log" > /dev/null 2>&1
check "pp 1 checkpoint resumed at pp 2 == continuing (worst $(worst "$tmp/r12.log" "$tmp/s20t"))" "same $tmp/r12.log $tmp/s20t 10"
$MPI -np 4 "$tmp/pp4zb-h1" $D --steps 20 --resume "$tmp/c2" --ckpt "$tmp/r24" --log "$tmp/r24.log" > /dev/null 2>&1
check "pp 2 checkpoint resumed at pp 4 (zb-h1) == continuing (worst $(worst "$tmp/r24.log" "$tmp/s20t"))" "same $tmp/r24.log $tmp/s20t 10"
$MPI -np 2 "$tmp/pp2" $D --steps 20 --resume "$tmp/c22" --ckpt "$tmp/r222" --log "$tmp/r222.log" > /dev/null 2>&1
check "pp 2 x dp 2 checkpoint resumed at pp 2 x dp 1 == continuing (worst $(worst "$tmp/r222.log" "$tmp/s20t"))" "same $tmp/r222.log $tmp/s20t 10"

sample() { "$K" sample "$1" --model models/tiny.lua --set layers=4 --prompt "The " --tokens 16 2>&1; }
a=$(sample "$tmp/c2/$F"); rc=$?
b=$(sample "$tmp/c1/$F")
check "kiln sample reads the pp 2 checkpoint (rc=$rc) and writes what it writes from the pp 1 one (\"$(printf '%s' "$a" | LC_ALL=C tr -c '[:print:]' '?')\")" \
    "[ $rc = 0 ] && [ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ]"
$MPI -np 2 "$tmp/pp2" $D --steps 10 --init "$tmp/c1/$F" --log "$tmp/i2.log" > /dev/null 2>&1
"$tmp/g4" $D --steps 10 --init "$tmp/c1/$F" --log "$tmp/i1.log" > /dev/null 2>&1
check "--init from a pp 1 checkpoint: pp 2 == pp 1 (worst $(worst "$tmp/i2.log" "$tmp/i1.log"))" "same $tmp/i2.log $tmp/i1.log 10"

# a loss mask (an input of the last stage only), --ignore-index and --val
cat > "$tmp/mask.lua" <<'LUA'
local nn = require "nn"
local c = config{vocab = 256, dim = 16, layers = 2, heads = 2, seq = 16, batch = 4, lr = 1e-2, warmup = 0}
local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local m = input("loss_mask", {c.batch, c.seq}, "f32")
local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02))
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))
for i = 0, c.layers - 1 do x = layer(i, function() return nn.gpt_block(x, c) end) end
local logits = matmul(nn.layernorm(x, "ln_f"), wte, {tb = true})
local ce = cross_entropy(logits, targets)
loss(sum(ce * m) / (sum(m) + 1e-30))
LUA
comp m1 "$tmp/mask.lua"
comp m2 "$tmp/mask.lua" --pp 2 --micro-batches 2
R="--steps 8 --ignore-index 32 --val $B/corpus.txt --val-every 4"
"$tmp/m1" $D $R --log "$tmp/m1.log" > /dev/null
$MPI -np 2 "$tmp/m2" $D $R --log "$tmp/m2.log" > /dev/null 2>&1
vals() { grep -o '"val_loss":[^,]*' "$1" | cut -d: -f2; }
valsame() { [ "$(vals "$1" | wc -l)" = 2 ] && paste <(vals "$1") <(vals "$2") | awk '{d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > 1e-5) bad = 1} END {exit bad}'; }
check "loss_mask on the last stage, --ignore-index 32, --val: --pp 2 == 1 rank (worst $(worst "$tmp/m2.log" "$tmp/m1.log"); val losses $(vals "$tmp/m2.log" | tr '\n' ' ')vs $(vals "$tmp/m1.log" | tr '\n' ' '))" \
    "same $tmp/m2.log $tmp/m1.log 8 && valsame $tmp/m2.log $tmp/m1.log"

err=$($MPI -np 3 "$tmp/pp2" $D --steps 2 2>&1 >/dev/null); rc=$?
check "a --pp 2 trainer on 3 processes is refused (rc=$rc): $(printf '%s' "$err" | grep -m1 'compiled for')" \
    "[ $rc != 0 ] && [ \$(printf '%s\n' \"\$err\" | grep -c 'compiled for') = 1 ] && printf '%s' \"\$err\" | grep -q 'compiled for 2 ranks (pp x dp x cp x tp = 2 x 1 x 1 x 1)'"
