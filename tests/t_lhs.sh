#!/usr/bin/env bash
# The latency-hiding schedule (--schedule lhs, compiler/lhs.c, docs/schedule.md):
#  - `kiln check --schedule lhs` equals one device (f64, relative 1e-9) for one
#    configuration per axis the suites check: dp (zero 1, micro-batches), cp
#    ring (p2p, also --no-overlap: comm on the compute stream) and
#    all-gather, pp 1f1b, interleaved, zb-h1 and zb-v (with dp and cp), tp,
#    offload (with pp; interleaved with offload keeps the late comm fence on
#    both stages, test_lhs), recompute none, full and gemm-last;
#  - lhs really reorders (the dump after schedule differs from fixed's) and
#    its IR text dump round-trips (parse + verify + dump gives the same text);
#  - under mpirun, the compiled CPU trainer's losses under lhs equal fixed's
#    over 30 steps (--pp 2 --dp 2: send/recv, collectives; relative 1e-5; and
#    zb-v --pp 2 --dp 2, where lhs keeps the cooldown's W by bucket),
#    and bit for bit with tp's own comm stream (--tp 2 --pp 2, offload all: lhs's tp
#    collectives on stream 4, fixed's on stream 1, which the dumps show);
#  - kiln plan --device-profile prints both orders' exposed time by class per
#    rank, each row equal to that order's own plan;
#  - a bad --schedule value is one line, exit 1.
. "$(dirname "$0")/lib.sh"
LR="--warmup 1 --lr 0.01"
GPT4="models/tiny.lua --set layers=4"
LLAMA="models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=4"
LLAMA4="models/llama.lua --set vocab=128 --set dim=64 --set layers=4 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=8 $LR"
kcheck() { # args...
    out=$(timeout 300 "$K" check "$@" --schedule lhs 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]]; then ok "check --schedule lhs $*: ${out##*: }"
    else notok "check --schedule lhs $*: rc=$rc $out"; fi
}
kcheck $LLAMA --dp 2 --micro-batches 2 --bucket-mb 0.02
kcheck $LLAMA --dp 2 --cp 2 --cp-comm p2p --zero 0
kcheck models/tiny.lua --cp 2 --cp-comm allgather
kcheck models/tiny.lua --dp 2 --cp 2 --cp-comm p2p --no-overlap --micro-batches 2
kcheck $GPT4 --pp 2 --micro-batches 4 --pp-schedule 1f1b
kcheck $GPT4 --pp 2 --vpp 2 --micro-batches 4 --pp-schedule interleaved
kcheck models/tiny.lua --pp 2 --dp 2 --micro-batches 2 --zero 0 --pp-schedule zb-h1
kcheck $LLAMA4 --pp 2 --cp 2 --cp-comm p2p --micro-batches 2 --pp-schedule zb-v
kcheck models/tiny.lua --tp 2 --micro-batches 2 --zero 0
kcheck $LLAMA --tp 2 --dp 2
kcheck $GPT4 --tp 2 --pp 2 --micro-batches 2 --pp-schedule zb-v --offload all --offload-min-bytes 1 --memory-budget 1e9 # tp's stream with pp, copies
kcheck $GPT4 --pp 2 --micro-batches 4 --offload all --offload-min-bytes 1
kcheck $GPT4 --pp 2 --vpp 2 --micro-batches 4 --pp-schedule interleaved --offload all --offload-min-bytes 1 # the late comm fence (test_lhs)
kcheck $LLAMA --offload all --offload-min-bytes 1
# the cooldown's W by bucket (schedule.c, cooldown_order): kept on both stages here
CD="$GPT4 --pp 2 --dp 2 --micro-batches 4 --pp-schedule zb-v --recompute none --bucket-mb 0.01 --memory-budget 1e9"
# shellcheck disable=SC2086
kcheck $CD
kcheck models/tiny.lua --dp 2 --micro-batches 2 --recompute full
kcheck $LLAMA --cp 2 --recompute none
kcheck $LLAMA --dp 2 --cp 2 --cp-comm p2p --recompute gemm-last

# lhs reorders; its dump round-trips
# (--memory-budget: with concat and slice as views the fixed order's plan
# packs tighter at this size than lhs's reorder, which the memory rule then
# refuses; the check is that lhs reorders at all)
F="$LLAMA --tp 2 --dp 2 --memory-budget 1e9"
# shellcheck disable=SC2086
"$K" dump $F --after schedule --schedule fixed > "$tmp/fixed.ir" 2>&1
# shellcheck disable=SC2086
"$K" dump $F --after schedule --schedule lhs > "$tmp/lhs.ir" 2>&1
check "dump --after schedule: lhs's order differs from fixed's ($(diff "$tmp/fixed.ir" "$tmp/lhs.ir" | grep -c '^>') lines)" \
    "! cmp -s $tmp/fixed.ir $tmp/lhs.ir && [ \$(grep -c ' = ' $tmp/lhs.ir) = \$(grep -c ' = ' $tmp/fixed.ir) ]"
"$K" dump "$tmp/lhs.ir" > "$tmp/lhs2.ir" 2>&1
check "the lhs dump round-trips (parse, verify, dump: same text)" "cmp -s $tmp/lhs.ir $tmp/lhs2.ir"
# shellcheck disable=SC2086
"$K" dump $LLAMA --dp 2 --after memplan --schedule lhs > "$tmp/lhsm.ir" 2>&1
"$K" dump "$tmp/lhsm.ir" > "$tmp/lhsm2.ir" 2>&1
check "the lhs dump after memplan round-trips" "cmp -s $tmp/lhsm.ir $tmp/lhsm2.ir"

# the cooldown's W by bucket: zb-v's deferred weight gradients fill their
# slots bucket by bucket, so more of the dp reduce-scatters are issued before
# the last W GEMM than with KILN_LHS_NO_COOLDOWN=1 (lhs without it)
rs_before_w() { awk '/^stage/{st=$2} st==1 && / wgrad / && /matmul/ {match($0,/pos[0-9]+/); last=substr($0,RSTART+3,RLENGTH-3)+0} st==1 && /reducescatter/ && /group="dp"/ {match($0,/pos[0-9]+/); rs[++n]=substr($0,RSTART+3,RLENGTH-3)+0} END{c=0; for(i=1;i<=n;i++) if(rs[i]<last) c++; print c+0}' "$1"; }
# shellcheck disable=SC2086
KILN_LHS_TRACE=1 "$K" dump $CD --after schedule --schedule lhs > "$tmp/cd.ir" 2> "$tmp/cd.err"
# shellcheck disable=SC2086
KILN_LHS_NO_COOLDOWN=1 "$K" dump $CD --after schedule --schedule lhs > "$tmp/nocd.ir" 2>&1
a=$(rs_before_w "$tmp/cd.ir"); b=$(rs_before_w "$tmp/nocd.ir")
check "zb-v --dp 2, stage 1: the cooldown's W by bucket issues $a dp reduce-scatters before the last W GEMM, $b without; kept on both stages ($(grep -c "the cooldown's W by bucket" "$tmp/cd.err"))" \
    "[ $a -gt $b ] && [ \$(grep -c \"the cooldown's W by bucket\" $tmp/cd.err) = 2 ]"

err=$("$K" check models/tiny.lua --schedule fast 2>&1 >/dev/null); rc=$?
check "--schedule fast is refused: $err" "[ $rc = 1 ] && [ \$(printf '%s\n' \"\$err\" | wc -l) = 1 ] && [[ \"\$err\" == *'expected fixed or lhs'* ]]"

# kiln plan --device-profile: both orders' exposed time by class per rank;
# each row equals the class table of the plan under that --schedule
class_row() { awk -v st="$2" '/^  exposed ms by class \(compute/{t=1; next} t && $1==st {$1=""; print; exit}' <<< "$1"; }
cmp_row() { awk -v st="$2" -v k="$3" '/^  exposed ms by class, --schedule fixed against lhs/{t=1; next} t && $1==st && $2==k {$1=$2=$NF=$(NF-1)=""; print; exit}' <<< "$1"; }
pf=$("$K" plan $F --device-profile cpu --schedule fixed 2>&1); pl=$("$K" plan $F --device-profile cpu --schedule lhs 2>&1)
for st in 0; do
    a=$(class_row "$pf" $st | xargs); b=$(cmp_row "$pl" $st fixed | xargs); c=$(class_row "$pl" $st | xargs); d=$(cmp_row "$pf" $st lhs | xargs)
    check "plan's fixed-against-lhs rows equal each order's own table (stage $st: fixed [$a], lhs [$c])" "[ -n '$a' ] && [ '$a' = '$b' ] && [ -n '$c' ] && [ '$c' = '$d' ]"
done

# the compiled trainer under mpirun: lhs's losses are fixed's
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
if ! command -v mpirun > /dev/null; then notok "mpirun is not installed (make test installs Open MPI: tools/deps.sh)"; exit 1; fi
need_corpus
D="--data $B/corpus.txt --threads 1"
M="models/tiny.lua --set layers=2 --steps 30 --pp 2 --dp 2 --micro-batches 2 --weight-decay 0.1 --bucket-mb 0.05"
# shellcheck disable=SC2086
"$K" compile $M --schedule fixed -o "$tmp/fixed" > /dev/null 2>&1 && "$K" compile $M --schedule lhs -o "$tmp/lhs" > /dev/null 2>&1
say $? "compile --pp 2 --dp 2 under fixed and lhs"
# under SAN=1: Open MPI's own allocations (MPI_Init's plugins) are still held
# at exit (as t_mpi.sh's nolsan); ASan and UBSan stay on
MPI="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 timeout 300 mpirun --oversubscribe -np 4"
$MPI "$tmp/fixed" $D --log "$tmp/lf" > /dev/null 2>&1
rf=$?
$MPI "$tmp/lhs" $D --log "$tmp/ll" > /dev/null 2>&1
rl=$?
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
worst() { paste <(losses "$1") <(losses "$2") | awk 'function abs(x){return x<0?-x:x} {d=abs($1-$2)/abs($2); if(d>w)w=d} END{printf "%.3g", w+0}'; }
check "mpirun -np 4 --pp 2 --dp 2: both exit 0 ($rf, $rl), lhs's losses == fixed's over 30 steps (worst $(worst "$tmp/ll" "$tmp/lf"))" \
    "[ $rf = 0 ] && [ $rl = 0 ] && [ \$(wc -l < $tmp/lf) = 30 ] && [ \$(wc -l < $tmp/ll) = 30 ] && awk -v w=$(worst "$tmp/ll" "$tmp/lf") 'BEGIN{exit !(w <= 1e-5)}'"

# zb-v with dp: lhs's cooldown order (the W slots by bucket) trains as fixed's
# shellcheck disable=SC2086
"$K" compile $CD --steps 30 --weight-decay 0.1 --schedule fixed -o "$tmp/cdfixed" > /dev/null 2>&1 && "$K" compile $CD --steps 30 --weight-decay 0.1 --schedule lhs -o "$tmp/cdlhs" > /dev/null 2>&1
say $? "compile zb-v --dp 2 under fixed and lhs (the cooldown's W by bucket)"
$MPI "$tmp/cdfixed" $D --log "$tmp/cf" > /dev/null 2>&1
rf=$?
$MPI "$tmp/cdlhs" $D --log "$tmp/cl" > /dev/null 2>&1
rl=$?
check "mpirun -np 4 zb-v --pp 2 --dp 2: both exit 0 ($rf, $rl), lhs's losses (the cooldown's W by bucket) == fixed's over 30 steps (worst $(worst "$tmp/cl" "$tmp/cf"))" \
    "[ $rf = 0 ] && [ $rl = 0 ] && [ \$(wc -l < $tmp/cf) = 30 ] && [ \$(wc -l < $tmp/cl) = 30 ] && awk -v w=$(worst "$tmp/cl" "$tmp/cf") 'BEGIN{exit !(w <= 1e-5)}'"

# tp's own comm stream (stream 4) and pp's (stream 5) under lhs, none under fixed; the compiled
# trainer's losses under lhs are fixed's, bit for bit
# (--memory-budget: at this size the dp-free program's two comm streams cost
# a few % of memory over fixed's peak and lhs would keep one; schedule.c)
MT="models/tiny.lua --set layers=2 --steps 30 --tp 2 --pp 2 --micro-batches 2 --offload all --offload-min-bytes 1 --memory-budget 1e9"
# shellcheck disable=SC2086
"$K" dump $MT --after schedule --schedule lhs > "$tmp/tpl.ir" 2>&1; "$K" dump $MT --after schedule --schedule fixed > "$tmp/tpf.ir" 2>&1
check "--tp 2 --pp 2: lhs puts the tp collectives on stream 4 ($(grep -c 'group="tp".* stream4 ' "$tmp/tpl.ir") of them), fixed puts none there" \
    "[ \$(grep -c 'group=\"tp\".* stream4 ' $tmp/tpl.ir) -gt 0 ] && ! grep -q ' stream4 ' $tmp/tpf.ir && [ \$(grep -c 'group=\"tp\"' $tmp/tpl.ir) = \$(grep -c 'group=\"tp\"' $tmp/tpf.ir) ]"
check "--tp 2 --pp 2: lhs puts every transfer over pp on stream 5 ($(grep -c 'group="pp".* stream5 ' "$tmp/tpl.ir") of $(grep -c 'group="pp"' "$tmp/tpl.ir")), fixed puts none there" \
    "[ \$(grep -c 'group=\"pp\".* stream5 ' $tmp/tpl.ir) -gt 0 ] && [ \$(grep -c 'group=\"pp\".* stream5 ' $tmp/tpl.ir) = \$(grep -c 'group=\"pp\"' $tmp/tpl.ir) ] && ! grep -q ' stream5 ' $tmp/tpf.ir"
# shellcheck disable=SC2086
"$K" compile $MT --schedule fixed -o "$tmp/tpfixed" > /dev/null 2>&1 && "$K" compile $MT --schedule lhs -o "$tmp/tplhs" > /dev/null 2>&1
say $? "compile --tp 2 --pp 2 under fixed and lhs"
$MPI "$tmp/tpfixed" $D --log "$tmp/tlf" > /dev/null 2>&1
rf=$?
$MPI "$tmp/tplhs" $D --log "$tmp/tll" > /dev/null 2>&1
rl=$?
check "mpirun -np 4 --tp 2 --pp 2: both exit 0 ($rf, $rl), lhs's losses (tp's and pp's own comm streams) == fixed's (one) over 30 steps, bit for bit" \
    "[ $rf = 0 ] && [ $rl = 0 ] && [ \$(wc -l < $tmp/tlf) = 30 ] && cmp -s <(losses $tmp/tlf) <(losses $tmp/tll)"
# Below MPI_THREAD_MULTIPLE (KILN_TEST_MPI_THREAD_LEVEL=2, MPI_THREAD_SERIALIZED:
# the runtime acts as if MPI provided only that) the two-stream program is
# refused in one line before it runs; fixed's one comm stream trains (one
# thread at a time in MPI, runtime/comm_mpi.c)
KILN_TEST_MPI_THREAD_LEVEL=2 $MPI -x KILN_TEST_MPI_THREAD_LEVEL "$tmp/tplhs" $D --steps 2 --log "$tmp/tls" > "$tmp/tls.out" 2>&1
rl=$?
KILN_TEST_MPI_THREAD_LEVEL=2 $MPI -x KILN_TEST_MPI_THREAD_LEVEL "$tmp/tpfixed" $D --steps 2 --log "$tmp/tfs" > /dev/null 2>&1
rf=$?
check "MPI_THREAD_SERIALIZED: lhs's two comm streams refused in one line (exit $rl: $(grep -m1 'needs MPI_THREAD_MULTIPLE' "$tmp/tls.out")), fixed's one stream trains (exit $rf, $(wc -l < "$tmp/tfs" 2>/dev/null) steps)" \
    "[ $rl != 0 ] && grep -q 'two comm streams at once, which needs MPI_THREAD_MULTIPLE' $tmp/tls.out && [ ! -s $tmp/tls ] && [ $rf = 0 ] && [ \$(wc -l < $tmp/tfs) = 2 ]"
