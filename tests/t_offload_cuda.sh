#!/usr/bin/env bash
# Activation offload on the CUDA back end, run on the fake CUDA stack
# (tests/cuda_fake; issue 19, docs/offload.md):
#  - tiny GPT compiled for cuda:sm_90 with --offload all (and none): the host
#    space is cuMemAllocHost'd pinned memory, the copies cuMemcpyDtoHAsync /
#    cuMemcpyHtoDAsync on the copy streams (2, 3), ordered by the schedule's
#    events (3 streams on one rank: compute, d2h, h2d); the trainer runs STEPS steps under KILN_FAKE_CUDA_STRICT=1 (the
#    fake's happens-before check, which tracks the pinned host memory too,
#    NaN-filled new memory, leaks) with the CUDA graph and with
#    KILN_NO_GRAPH=1, and gives the losses and gradient norms of --offload
#    none bit for bit, and the CPU trainer's within the bf16 tolerances
#    t_cuda_fake.sh uses (loss 2^-8, gradient norm 2^-6 relative);
#  - the measured act high-water mark (KILN_MEASURE_PEAK=1) falls with
#    offload and equals the table's act space less its 64-byte padding;
#  - planted: dev_cuda.c's KILN_TEST_DROP_COPY_WAIT=1 drops the compute
#    stream's first wait for a reload's event: the fake reports a kernel
#    touching memory "while a copy into it may still be in flight" and the
#    strict run exits 1; with the graph too (the replay's check);
#  - 2 ranks (mpirun, the fake NCCL): tiny GPT --pp 2 (1f1b) with --offload
#    all on the fakes, graph and eager, equals --offload none bit for bit
#    and the CPU trainer's pipeline within the bf16 tolerances.
. "$(dirname "$0")/lib.sh"
F=$B/cuda_fake
STEPS=${STEPS:-4}
SHAPE=(--set batch=2 --set seq=32 --set layers=2)
LOSS_RTOL=0.00390625 NORM_RTOL=0.015625
mkdir -p "$F" || exit 1
make -s "$B/libkilnrt_cuda.a" > /dev/null 2>&1
if ! tests/cuda_fake/build_libs.sh "$F" > "$tmp/log" 2>&1 ||
    ! tests/cuda_fake/build_kernels.sh kernels/cuda/*.cu -o "$F/libkernels.so" > "$tmp/log" 2>&1; then
    notok "build the fakes and the kernel registry: $(tr '\n' ' ' < "$tmp/log" | head -c 1000)"; echo "1..$n"; exit 1
fi
DATA=$tmp/data.txt
cp tests/train.txt "$DATA" || exit 1
losses() { sed 's/.*"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2/' "$1" 2>/dev/null; }
for pol in none all; do
    T=$tmp/cuda_$pol
    if ! "$K" compile models/tiny.lua "${SHAPE[@]}" --target cuda:sm_90 --emit cuda --offload $pol --offload-min-bytes 1 -o "$T" > "$tmp/log" 2>&1 ||
        ! tests/cuda_fake/build_kernels.sh "$T.cu" -o "$F/liboffload_$pol.so" > "$tmp/log" 2>&1; then
        notok "compile --target cuda:sm_90 --offload $pol and its kernels: $(tr '\n' ' ' < "$tmp/log" | head -c 600)"; echo "1..$n"; exit 1
    fi
done
# run NAME POLICY ENV...: STEPS steps on the fakes, strict; rc in $rc
run() {
    local name=$1 pol=$2; shift 2
    timeout 600 env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$F/libkernels.so:$F/liboffload_$pol.so" \
        KILN_FAKE_CUDA_STRICT=1 "$@" "$tmp/cuda_$pol" --data "$DATA" --steps "$STEPS" --log "$tmp/$name.log" > "$tmp/$name.out" 2>&1
    rc=$?
    losses "$tmp/$name.log" > "$tmp/$name.loss"
}
run none none KILN_MEASURE_PEAK=1
say $rc "CUDA --offload none on the fakes, strict: $STEPS steps ($(cut -d' ' -f1 "$tmp/none.loss" | tr '\n' ' '))"
run graph all KILN_MEASURE_PEAK=1 KILN_FAKE_CUDA_PROFILE=1
check "CUDA --offload all, CUDA graph, strict (no race, no leak): rc $rc, $(grep -c . "$tmp/graph.loss") steps$(grep -m1 -o 'fake cuda: graph: [0-9]* ops on [0-9]* streams' "$tmp/graph.out" | sed 's/^fake cuda: graph:/; graph:/')" \
    "[ $rc = 0 ] && grep -q 'fake cuda: graph: [0-9]* ops on 3 streams' $tmp/graph.out"
run eager all KILN_NO_GRAPH=1
say $rc "CUDA --offload all, KILN_NO_GRAPH=1, strict: rc $rc"
check "--offload all == none on CUDA, graph and eager, bit for bit ($STEPS steps)" \
    "[ -s $tmp/none.loss ] && cmp -s $tmp/graph.loss $tmp/none.loss && cmp -s $tmp/eager.loss $tmp/none.loss"
"$K" compile models/tiny.lua "${SHAPE[@]}" -o "$tmp/cpu" > /dev/null 2>&1 && "$tmp/cpu" --data "$DATA" --steps "$STEPS" --log "$tmp/cpu.log" > /dev/null 2>&1
losses "$tmp/cpu.log" > "$tmp/cpu.loss"
w=$(paste -d' ' "$tmp/graph.loss" "$tmp/cpu.loss" | awk -v n="$STEPS" 'function a(x){return x<0?-x:x}
    NF == 4 { l = a($1-$3)/a($3); g = a($2-$4)/a($4); if (l > wl) wl = l; if (g > wg) wg = g; k++ }
    END { if (k != n) print "missing"; else printf "%.2e %.2e", wl, wg }')
check "CUDA --offload all (bf16, fakes) vs the CPU trainer (f32): worst relative loss, gradient norm: $w (tolerances 2^-8, 2^-6)" \
    "[ \"$w\" != missing ] && awk -v l=${w% *} -v g=${w#* } -v tl=$LOSS_RTOL -v tg=$NORM_RTOL 'BEGIN{exit !(l <= tl && g <= tg)}'"
mark() { sed -n 's/.*act high-water mark \([0-9]*\) bytes (measured; act space \([0-9]*\),.*/\1 \2/p' "$1"; }
mn=($(mark "$tmp/none.out")) ma=($(mark "$tmp/graph.out"))
check "measured act high-water mark: none ${mn[0]:-?} of ${mn[1]:-?} bytes, all ${ma[0]:-?} of ${ma[1]:-?} (falls; each within the space's last 64 bytes)" \
    "[ ${#mn[@]} = 2 ] && [ ${#ma[@]} = 2 ] && [ ${ma[0]} -lt ${mn[0]} ] && [ \$(( (${mn[0]} + 63) / 64 * 64 )) = ${mn[1]} ] && [ \$(( (${ma[0]} + 63) / 64 * 64 )) = ${ma[1]} ]"
for mode in eager graph; do
    extra=(); [ $mode = eager ] && extra=(KILN_NO_GRAPH=1)
    run bug_$mode all KILN_TEST_DROP_COPY_WAIT=1 "${extra[@]}"
    check "planted ($mode): the compute stream's wait for a reload dropped: rc $rc; $(grep -m1 'in flight' "$tmp/bug_$mode.out" | cut -c1-220)" \
        "[ $rc != 0 ] && grep -q 'while a copy (cuMemcpyHtoDAsync) into it on stream [0-9]*.*may still be in flight' $tmp/bug_$mode.out"
done

# ---- 2 ranks: --pp 2 ----
if command -v mpirun > /dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
    PP=(models/tiny.lua "${SHAPE[@]}" --set layers=4 --pp 2 --micro-batches 2 --offload-min-bytes 1)
    for pol in none all; do
        "$K" compile "${PP[@]}" --offload $pol --target cuda:sm_90 --emit cuda -o "$tmp/pp_$pol" > "$tmp/log" 2>&1 &&
            tests/cuda_fake/build_kernels.sh "$tmp/pp_$pol.cu" -o "$F/liboffload_pp_$pol.so" >> "$tmp/log" 2>&1 ||
            notok "--pp 2 --offload $pol for cuda:sm_90: $(tr '\n' ' ' < "$tmp/log" | head -c 600)"
    done
    "$K" compile "${PP[@]}" -o "$tmp/pp_cpu" > /dev/null 2>&1 &&
        timeout 120 mpirun -np 2 --oversubscribe "$tmp/pp_cpu" --data "$DATA" --steps "$STEPS" --log "$tmp/pp_cpu.log" > /dev/null 2>&1
    losses "$tmp/pp_cpu.log" > "$tmp/pp_cpu.loss"
    runpp() { # name policy env...
        local name=$1 pol=$2; shift 2
        # (under SAN=1 without LeakSanitizer: Open MPI's MPI_Init allocations are held at exit, as t_mpi.sh's nolsan)
        timeout 300 mpirun -np 2 --oversubscribe env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 \
            KILN_FAKE_CUDA_KERNELS="$F/libkernels.so:$F/liboffload_pp_$pol.so" KILN_FAKE_CUDA_STRICT=1 KILN_FAKE_NCCL_TIMEOUT=30 "$@" \
            "$tmp/pp_$pol" --data "$DATA" --steps "$STEPS" --log "$tmp/$name.log" > "$tmp/$name.out" 2>&1
        rc=$?
        losses "$tmp/$name.log" > "$tmp/$name.loss"
    }
    runpp ppnone none KILN_FAKE_CUDA_PROFILE=1
    runpp ppgraph all KILN_FAKE_CUDA_PROFILE=1
    g=$(grep -o 'fake cuda: graph: [0-9]* ops on [0-9]* streams' "$tmp/ppgraph.out" | sed 's/^fake cuda: graph: //' | paste -sd',')
    check "--pp 2 --offload all on 2 ranks, CUDA graph, strict: rc $rc; the ranks' graphs: $g (stage 0's has the copy streams: 4)" \
        "[ $rc = 0 ] && grep -q 'fake cuda: graph: [0-9]* ops on 4 streams' $tmp/ppgraph.out"
    runpp ppeager all KILN_NO_GRAPH=1
    say $rc "--pp 2 --offload all on 2 ranks, KILN_NO_GRAPH=1, strict: rc $rc"
    check "--pp 2: --offload all == none on CUDA, graph and eager, bit for bit ($(cut -d' ' -f1 "$tmp/ppgraph.loss" | tr '\n' ' '))" \
        "[ -s $tmp/ppnone.loss ] && cmp -s $tmp/ppgraph.loss $tmp/ppnone.loss && cmp -s $tmp/ppeager.loss $tmp/ppnone.loss"
    w=$(paste -d' ' "$tmp/ppgraph.loss" "$tmp/pp_cpu.loss" | awk -v n="$STEPS" 'function a(x){return x<0?-x:x}
        NF == 4 { l = a($1-$3)/a($3); g = a($2-$4)/a($4); if (l > wl) wl = l; if (g > wg) wg = g; k++ }
        END { if (k != n) print "missing"; else printf "%.2e %.2e", wl, wg }')
    check "--pp 2 --offload all: CUDA (fakes) vs the CPU trainer on 2 ranks: worst relative loss, gradient norm: $w" \
        "[ \"$w\" != missing ] && awk -v l=${w% *} -v g=${w#* } -v tl=$LOSS_RTOL -v tg=$NORM_RTOL 'BEGIN{exit !(l <= tl && g <= tg)}'"
else
    notok "--pp 2: mpirun is not installed"
fi
echo "1..$n"
