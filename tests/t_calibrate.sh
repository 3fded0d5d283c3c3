#!/usr/bin/env bash
# kiln calibrate (issue 21): --quick on this CPU writes a profile that the
# loader reads back (kiln plan runs on it and names it), with every field
# (the per-kernel-kind rates too) measured and its source in a comment; under mpirun the links are
# measured, each collective algorithm's own α and β and its time by
# size, the runtime's own point-to-point exchange by size (a small one
# slower than MPI's alone), and the cores the
# ranks share (cores, threads, thread_speedup) are stated, one thread a
# rank when 4 ranks would oversubscribe the cores; bad flags are
# one line with exit status 1.
. "$(dirname "$0")/lib.sh"

out=$("$K" calibrate --device cpu --quick -o "$tmp/c.profile" --name calib1 2>&1)
say $? "calibrate --quick runs: $out"
first=$("$K" plan models/tiny.lua --device-profile "$tmp/c.profile" 2>&1 | head -1)
check "the written profile reads back: $first" "[[ '$first' == 'device calib1 ($tmp/c.profile)'* ]]"
pred=$("$K" plan models/tiny.lua --device-profile "$tmp/c.profile" 2>&1 | grep '^predicted step')
check "kiln plan predicts on it: $pred" "[[ '$pred' == 'predicted step '*' on calib1, MFU '* ]]"
for f in peak_flops_f32 gemm_eff attn_eff mem_bw mem_bw_table launch_overhead_s h2d_bw attn_score_s attn_bwd_eff attn_bwd_score_s attn_row_s attn_bwd_row_s \
         norm_bw norm_bwd_bw xent_bw xent_bwd_bw copy_bw copy_bw_table sumto_bw adamw_bw sumsq_bw step_overhead_s ew_transc_s pool_wake_s; do
    check "$f measured, with its source" "grep -q '^$f .*# ' '$tmp/c.profile'"
done
check "one rank: the links say they are not measured" "grep -q '^intra_alpha_s .*not measured' '$tmp/c.profile'"
# the file is the loader's: planting a bad value in it is caught
sed 's/^attn_eff .*/attn_eff 1.5/' "$tmp/c.profile" > "$tmp/bad.profile"
err=$("$K" plan models/tiny.lua --device-profile "$tmp/bad.profile" 2>&1)
check "a planted bad field in it is refused: $err" "[[ '$err' == *'field \"attn_eff\": expected a fraction'* ]]"

if command -v mpirun > /dev/null; then
    # under SAN=1: Open MPI's own allocations (MPI_Init's plugins) are still
    # held at exit (as t_mpi.sh's nolsan); ASan and UBSan stay on
    MPI="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 timeout 120 mpirun --oversubscribe --allow-run-as-root"
    out=$($MPI -np 2 "$K" calibrate --device cpu --quick -o "$tmp/m.profile" 2>&1)
    say $? "calibrate --quick under mpirun -np 2: $out"
    check "the links are measured over 2 ranks" "grep -q '^intra_alpha_s .*MPI_Allreduce over 2 local ranks' '$tmp/m.profile' && grep -q '^node_size *2 ' '$tmp/m.profile'"
    for c in allreduce allgather reducescatter p2p; do
        check "$c's own alpha and beta are measured" "grep -q '^${c}_alpha_s .* 2 ranks' '$tmp/m.profile' && grep -q '^${c}_beta ' '$tmp/m.profile'"
        check "$c's time by size is measured (4 sizes under --quick)" "grep -q '^${c}_table \\([0-9.e+]*:[0-9.e+-]* \\)\\{4\\} *# .* 2 ranks' '$tmp/m.profile'"
    done
    # the runtime's own exchange (streams, staging copy, receive, wake-ups):
    # at 64 bytes a rank, where two thread wake-ups dwarf MPI's ~1 us, slower
    # than MPI_Sendrecv's transfer alone (at 1 MiB both are the copy: no order)
    for c in p2p_runtime p2p_posted; do
        check "${c}_table is measured (4 sizes, its source stated)" "grep -q '^${c}_table *\\([0-9.e+]*:[0-9.e+-]* \\)\\{4\\} *# the runtime.s exchange, 2 ranks' '$tmp/m.profile'"
        small=$(awk -v k="${c}_table" '$1 == "p2p_table" || $1 == k {split($2, a, ":"); t[$1] = a[2]} END {print t[k], t["p2p_table"]}' "$tmp/m.profile")
        check "$c: 128 bytes take longer than MPI_Sendrecv's (runtime, MPI: $small s)" "awk -v a='${small% *}' -v b='${small#* }' 'BEGIN {exit !(a > b && b > 0)}'"
    done
    check "the cores the ranks share and a rank's threads are stated, with their sources" "grep -q '^cores  *[0-9][0-9]*  *# sysconf' '$tmp/m.profile' && grep -q '^threads  *[0-9][0-9]*  *# sched_getaffinity' '$tmp/m.profile' && grep -q '^thread_speedup  *[0-9.]*  *# OpenBLAS' '$tmp/m.profile'"
    check "the links' times are scaled to one rank's alone, the factor stated" "grep -q '^intra_alpha_s .*times x [0-9.]*: one rank' '$tmp/m.profile'"
    pm=$("$K" plan models/tiny.lua --dp 2 --device-profile "$tmp/m.profile" 2>&1 | grep -c '^predicted step')
    check "kiln plan reads the per-algorithm fields" "[ '$pm' = 1 ]"
    # 4 local ranks: when they would oversubscribe the host's cores (here 2),
    # one thread a rank, as the runtime runs them (dev_cpu.c's cores()); a
    # host of 4 or more cores binds each rank to one core: 1 too
    out=$($MPI -np 4 "$K" calibrate --device cpu --quick -o "$tmp/m4.profile" 2>&1)
    say $? "calibrate --quick under mpirun -np 4: $out"
    want=$(( $(nproc) / 4 > 1 ? $(nproc) / 4 : 1 ))
    got=$(awk '$1 == "threads" {print $2}' "$tmp/m4.profile")
    check "4 ranks on $(nproc) cores: at most $want thread(s) a rank (got $got)" "[ -n '$got' ] && [ '$got' -le '$want' ]"
else
    notok "mpirun is not installed (make test installs Open MPI: tools/deps.sh)"
fi

bad() { # DESCRIPTION WANT ARGS...
    local d=$1 want=$2
    shift 2
    local out rc
    out=$("$K" calibrate "$@" 2>&1)
    rc=$?
    check "$d: $out" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [ \"\$out\" = \"\$want\" ]"
}
bad "an unknown device" 'kiln: --device: expected cpu or cuda, got "tpu"' --device tpu -o "$tmp/g.profile"
bad "no -o" "kiln: calibrate: -o FILE.profile is required" --device cpu
bad "no --device" "kiln: usage: kiln calibrate --device cpu|cuda -o FILE.profile [--quick] [--threads N] [--name NAME] [--base PROFILE] [--arch sm_XX]" -o "$tmp/g.profile"
bad "a bad --threads" 'kiln: --threads: expected a whole number in 1..1024, got "0"' --device cpu --threads 0 -o "$tmp/g.profile"
bad "--threads is the CPU's" "kiln: --threads: the CPU's (a GPU rank has no threads to choose)" --device cuda --threads 2 -o "$tmp/g.profile"
bad "a bad --arch" 'kiln: --arch: expected sm_XX (the GPU'"'"'s compute capability, sm_90 for an H100 or H200), got "90"' --device cuda --arch 90 -o "$tmp/g.profile"
bad "--arch with the cpu" "kiln: --arch: only with --device cuda" --device cpu --arch sm_90 -o "$tmp/g.profile"
check "nothing written on errors" "[ ! -e '$tmp/g.profile' ]"
echo "1..$n"
