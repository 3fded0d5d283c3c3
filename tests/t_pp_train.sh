#!/usr/bin/env bash
# Pipeline stages through the back end and the compiled trainer under mpirun
# (issue 18): one program table per stage, each rank running its stage's,
# checkpoints that stay logical across pp.
#
# The module is synthetic, made from the documented text form of the IR
# (docs/ir.md): tiny GPT compiled through memplan (kiln dump), then a second
# stage that is a copy of the first, on a mesh of pp 2.  Every param is then
# held by both stages (as a tied embedding is) with the same values, every
# stage computes the whole loss, so each rank's curve must be the 1-stage
# program's exactly.  The copy's locations name "tiny.lua.stage1", so the
# ranks' traces show which table each ran.  A variant renames stage 1's
# optimizer counter (opt.step.s1): a tensor only stage 1 holds, which the
# pp 2 checkpoint must gather from rank 1 and a pp 1 program must refuse.
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
MPI="timeout 300 mpirun --oversubscribe"
if ! command -v mpirun > /dev/null; then echo "not ok 1 - mpirun is not installed (make test installs Open MPI: tools/deps.sh)"; exit 1; fi
need_corpus
D="--data $B/corpus.txt --threads 1"
"$K" dump models/tiny.lua --set layers=1 --steps 30 --weight-decay 0.1 -o "$tmp/one.ir"
# two stages: mesh pp 2, stage 1 = stage 0 with its locations renamed (and, for
# the variant, its optimizer counter)
two_stages() { # out.ir [sed expression for stage 1]
    awk -v extra="${2:-}" 'NR == 1 { sub(/mesh=1x/, "mesh=2x"); print; next }
         NR == 2 { print; next }
         { body[++nb] = $0; print }
         END { print ""; print "stage 1"
               for (i = 1; i <= nb; i++) { l = body[i]; gsub(/tiny\.lua:/, "tiny.lua.stage1:", l)
                   if (extra != "") gsub(/name="opt\.step"/, "name=\"opt.step.s1\"", l)
                   print l } }' "$tmp/one.ir" > "$1"
}
two_stages "$tmp/two.ir"
two_stages "$tmp/var.ir" rename
# pp 2 x dp 2: the same from a --dp 2 dump (the distributed optimizer's buckets in each stage)
"$K" dump models/tiny.lua --set layers=1 --steps 30 --weight-decay 0.1 --dp 2 --bucket-mb 0.05 -o "$tmp/dp.ir"
awk 'NR == 1 { sub(/mesh=1x2x/, "mesh=2x2x"); print; next } NR == 2 { print; next }
     { body[++nb] = $0; print } END { print ""; print "stage 1"; for (i = 1; i <= nb; i++) print body[i] }' "$tmp/dp.ir" > "$tmp/twodp.ir"
for p in one two var twodp; do "$K" compile "$tmp/$p.ir" -o "$tmp/$p" > /dev/null || echo "# compile $p failed"; done
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
worst() { paste <(losses "$1") <(losses "$2") | awk 'function abs(x){return x<0?-x:x} {d=abs($1-$2)/abs($2); if(d>w)w=d} END{printf "%.3g", w+0}'; }
same() { # log a, log b, lines
    [ "$(wc -l < "$1")" = "$3" ] && [ "$(wc -l < "$2")" = "$3" ] && awk -v w="$(worst "$1" "$2")" 'BEGIN{exit !(w <= 1e-5)}'
}

"$tmp/one" $D --log "$tmp/l1" > /dev/null
$MPI -np 2 "$tmp/two" $D --log "$tmp/l2" --trace "$tmp/tr.json" > /dev/null 2>"$tmp/err2"
check "mpirun -np 2, two stages == 1 stage over 30 steps (worst $(worst "$tmp/l2" "$tmp/l1"))" "same $tmp/l2 $tmp/l1 30"
check "rank 0 ran stage 0's table, rank 1 stage 1's (their traces' launch names)" \
    "! grep -q 'tiny.lua.stage1' $tmp/tr.json && grep -q 'tiny.lua.stage1' $tmp/tr.json.rank1"
$MPI -np 2 "$K" run "$tmp/two.ir" $D --log "$tmp/lj" > /dev/null 2>&1
check "mpirun -np 2 kiln run (JIT), two stages == 1 stage over 30 steps (worst $(worst "$tmp/lj" "$tmp/l1"))" "same $tmp/lj $tmp/l1 30"
# the comparison can fail: another learning rate gives another curve
"$tmp/one" $D --lr 0.01 --log "$tmp/lx" > /dev/null
check "the comparison tells curves apart (another --lr: worst $(worst "$tmp/lx" "$tmp/l1"))" "! same $tmp/lx $tmp/l1 30"

# checkpoints: pp 2 -> pp 1 and pp 1 -> pp 2 continue the 20-step curve
"$tmp/one" $D --steps 20 --log "$tmp/s1" > /dev/null
tail -10 "$tmp/s1" > "$tmp/s1tail"
$MPI -np 2 "$tmp/two" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/ck2" > /dev/null 2>&1
"$tmp/one" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/ck1" > /dev/null
check "the pp 2 checkpoint is the pp 1 one byte for byte (every tied tensor once)" \
    "cmp -s $tmp/ck2/step_00000010.safetensors $tmp/ck1/step_00000010.safetensors"
"$tmp/one" $D --steps 20 --resume "$tmp/ck2" --ckpt "$tmp/r1" --log "$tmp/l21" > /dev/null 2>&1
check "pp 2 checkpoint resumed at pp 1 == continuing (worst $(worst "$tmp/l21" "$tmp/s1tail"))" "same $tmp/l21 $tmp/s1tail 10"
$MPI -np 2 "$tmp/two" $D --steps 20 --resume "$tmp/ck1" --ckpt "$tmp/r2" --log "$tmp/l12" > /dev/null 2>&1
check "pp 1 checkpoint resumed at pp 2 == continuing (worst $(worst "$tmp/l12" "$tmp/s1tail"))" "same $tmp/l12 $tmp/s1tail 10"

# pp 2 x dp 2 on 4 ranks; its checkpoint resumed at pp 1 x dp 1
$MPI -np 4 "$tmp/twodp" $D --log "$tmp/l4" > /dev/null 2>&1
check "mpirun -np 4, two stages x dp 2 (zero 1) == 1 rank over 30 steps (worst $(worst "$tmp/l4" "$tmp/l1"))" "same $tmp/l4 $tmp/l1 30"
$MPI -np 4 "$tmp/twodp" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/ck4" > /dev/null 2>&1
"$tmp/one" $D --steps 20 --resume "$tmp/ck4" --ckpt "$tmp/r41" --log "$tmp/l41" > /dev/null 2>&1
check "pp 2 x dp 2 checkpoint resumed at pp 1 == continuing (worst $(worst "$tmp/l41" "$tmp/s1tail"))" "same $tmp/l41 $tmp/s1tail 10"
$MPI -np 4 "$tmp/twodp" $D --steps 20 --resume "$tmp/ck1" --ckpt "$tmp/r14" --log "$tmp/l14" > /dev/null 2>&1
check "pp 1 checkpoint resumed at pp 2 x dp 2 == continuing (worst $(worst "$tmp/l14" "$tmp/s1tail"))" "same $tmp/l14 $tmp/s1tail 10"

# a tensor only stage 1 holds: gathered from rank 1 into rank 0's file
$MPI -np 2 "$tmp/var" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/ckv" > /dev/null 2>&1
F="$tmp/ckv/step_00000010.safetensors"
check "stage 1's own tensor opt.step.s1 is in the checkpoint, beside stage 0's opt.step" \
    "head -c 65536 $F | grep -aq '\"opt.step.s1\"' && head -c 65536 $F | grep -aq '\"opt.step\"'"
$MPI -np 2 "$tmp/var" $D --steps 20 --resume "$tmp/ckv" --ckpt "$tmp/rv" --log "$tmp/lv" > /dev/null 2>&1
check "that checkpoint resumed at pp 2 == continuing (worst $(worst "$tmp/lv" "$tmp/s1tail"))" "same $tmp/lv $tmp/s1tail 10"
err=$("$tmp/one" $D --steps 20 --resume "$tmp/ckv" --ckpt "$tmp/rx" 2>&1 >/dev/null); rc=$?
check "a pp 1 program refuses it, naming the tensor no stage of it holds (rc=$rc)" \
    "[ $rc != 0 ] && printf '%s' \"\$err\" | grep -q 'unexpected tensor \"opt.step.s1\"'"

err=$($MPI -np 3 "$tmp/two" $D --steps 2 2>&1 >/dev/null); rc=$?
check "a 2-stage trainer on 3 processes is refused (rc=$rc): $(printf '%s' "$err" | grep -m1 'compiled for')" \
    "[ $rc != 0 ] && printf '%s' \"\$err\" | grep -q 'compiled for 2 ranks (pp x dp x cp x tp = 2 x 1 x 1 x 1)'"
