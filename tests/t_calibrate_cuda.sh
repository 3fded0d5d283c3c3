#!/usr/bin/env bash
# kiln calibrate --device cuda (issue 21) on the fake CUDA stack
# (tests/cuda_fake: the kernels run on the host emulator, so the numbers
# mean nothing; the path is what is checked): kiln compiles the library
# kernels and becomes kiln-calibrate-cuda, which measures through the CUDA
# runtime and writes a profile the loader reads back, every measured field
# with its source, nothing left on disk (the cubins travel in a memory
# file); a kernel made 50 ms
# slower (KILN_FAKE_CUDA_TEST_SLOW) shows in its kind's rate, so the
# field times that kernel; under mpirun -np 2 the links are measured over
# the fake NCCL; without the program beside kiln, one line (the bad
# flags: t_calibrate.sh).
. "$(dirname "$0")/lib.sh" && . "$(dirname "$0")/cuda_lib.sh"

cuda_fakes || build_failed "building the fake CUDA stack"
FAKE=(env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$F/libkernels.so" KILN_FAKE_CUDA_STRICT=1)
mkdir -p "$tmp/td"

out=$(TMPDIR=$tmp/td timeout 300 "${FAKE[@]}" "$K" calibrate --device cuda --small --quick -o "$tmp/g.profile" --name gpu1 2>&1)
say $? "calibrate --device cuda --small --quick on the fakes: $(echo "$out" | tail -1)"
check "nothing written to TMPDIR (the cubins travel in a memory file)" "[ -z \"\$(ls -A '$tmp/td')\" ]"
first=$("$K" plan models/tiny.lua --device-profile "$tmp/g.profile" 2>&1 | head -1)
check "the written profile reads back: $first" "[[ '$first' == 'device gpu1 ($tmp/g.profile)'* ]]"
pred=$("$K" plan models/tiny.lua --precision bf16 --device-profile "$tmp/g.profile" 2>&1 | grep '^predicted step')
check "kiln plan predicts on it: $pred" "[[ '$pred' == 'predicted step '*' on gpu1, MFU '* ]]"
for f in gemm_eff attn_eff attn_bwd_eff norm_bw norm_bwd_bw xent_bw xent_bwd_bw copy_bw copy_bw_table sumto_bw adamw_bw sumsq_bw \
         mem_bw mem_bw_table launch_overhead_s step_overhead_s h2d_bw d2h_bw; do
    check "$f measured by the runtime's kernels" "grep -q '^$f .*# .*rtk_' '$tmp/g.profile'"
done
check "memory_bytes from the driver" "grep -q '^memory_bytes .*# cuMemGetInfo' '$tmp/g.profile'"
check "gemm_eff has 3 sizes, copy_bw_table 4 runs, mem_bw_table 3 sizes" \
    "grep -q '^gemm_eff *\\([0-9.e+-]*:[0-9.e+-]* \\)\\{3\\} *#' '$tmp/g.profile' && grep -q '^copy_bw_table *\\([0-9.e+-]*:[0-9.e+-]* \\)\\{4\\} *#' '$tmp/g.profile' && grep -q '^mem_bw_table *\\([0-9.e+-]*:[0-9.e+-]* \\)\\{3\\} *#' '$tmp/g.profile'"
check "the tensor-core attention is timed too" "grep -q '^attn_eff .*(--attention tc: ' '$tmp/g.profile'"
check "one rank: the links say they are not measured" "grep -q '^intra_alpha_s .*not measured' '$tmp/g.profile' && grep -q '^node_size  *8 ' '$tmp/g.profile'"

# the field times the kernel it names: kiln_layernorm_fwd 50 ms slower makes
# norm_bw's bytes (bf16 [64,256] in and out, w and b) take 50 ms more (a
# difference of two steps' medians of 3 under --small: the floor, 40 ms,
# leaves 10 ms for the machine's noise; 20 ms with a 2 ms margin failed
# once in CI, at 16.3 ms)
slow=$(TMPDIR=$tmp/td timeout 300 "${FAKE[@]}" KILN_FAKE_CUDA_TEST_SLOW=kiln_layernorm_fwd:0.05 "$K" calibrate --device cuda --small --quick -o "$tmp/s.profile" 2>&1)
say $? "calibrate with kiln_layernorm_fwd 50 ms slower: $(echo "$slow" | tail -1)"
secs() { awk -v f="$1" '$1 == f {printf "%.6f", 66560 / $2}' "$2"; }
base=$(secs norm_bw "$tmp/g.profile") slowed=$(secs norm_bw "$tmp/s.profile")
check "norm_bw's kernel: $base s, $slowed s slowed (want under 15 ms, then at least 40 ms and at most 90 ms + 4x the first: not two sleeps)" \
    "awk -v a='$base' -v b='$slowed' 'BEGIN {exit !(a >= 0 && a < 0.015 && b >= 0.04 && b <= 0.09 + 4 * a)}'"

if command -v mpirun > /dev/null; then
    # under SAN=1: Open MPI's own allocations (MPI_Init's plugins) are still
    # held at exit (as t_mpi.sh's nolsan); ASan and UBSan stay on
    out=$(TMPDIR=$tmp/td timeout 300 mpirun -np 2 --oversubscribe --allow-run-as-root "${FAKE[@]}" ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 "$K" calibrate --device cuda --small --quick -o "$tmp/m.profile" 2>&1)
    say $? "calibrate --device cuda under mpirun -np 2 (the fake NCCL): $(echo "$out" | tail -1)"
    check "the links are measured over 2 ranks" "grep -q '^intra_alpha_s .*rtk_allreduce (NCCL) over 2 local ranks' '$tmp/m.profile' && grep -q '^node_size  *2 ' '$tmp/m.profile'"
    for c in allreduce allgather reducescatter p2p; do
        check "$c's alpha, beta and time by size (2 sizes under --small)" \
            "grep -q '^${c}_alpha_s .* 2 ranks' '$tmp/m.profile' && grep -q '^${c}_beta ' '$tmp/m.profile' && grep -q '^${c}_table \\([0-9.e+]*:[0-9.e+-]* \\)\\{2\\} *# .* 2 ranks' '$tmp/m.profile'"
    done
    pm=$("$K" plan models/tiny.lua --dp 2 --device-profile "$tmp/m.profile" 2>&1 | grep -c '^predicted step')
    check "kiln plan --dp 2 reads the measured links" "[ '$pm' = 1 ]"
    check "nothing written to TMPDIR by either rank" "[ -z \"\$(ls -A '$tmp/td')\" ]"
else
    notok "mpirun is not installed (make test installs Open MPI: tools/deps.sh)"
fi

if ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    ok "no CUDA driver: not reachable on this machine, which has one # SKIP"
else
out=$("$K" calibrate --device cuda -o "$tmp/b.profile" 2>&1)
rc=$?
check "no CUDA driver (this machine without the fakes): one line ($out)" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [[ \"\$out\" == 'kiln: calibrate --device cuda: no CUDA driver on this machine ('* ]]"
fi
out=$(TMPDIR=$tmp/td "${FAKE[@]}" KILN_FAKE_CUDA_DEVICES=0 "$K" calibrate --device cuda --small -o "$tmp/b.profile" 2>&1)
rc=$?
check "a driver without a GPU: the runtime's one line ($out)" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | grep -vc '^fake cuda:')\" = 1 ] && [[ \"\$out\" == *'no CUDA device'* ]]"
out=$("${FAKE[@]}" "$K" calibrate --device cuda --base nope -o "$tmp/b.profile" 2>&1)
rc=$?
check "a bad --base is refused before the kernels compile: one line ($out)" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [[ \"\$out\" == 'kiln: --base: '* ]]"
out=$(TMPDIR=$tmp/td "${FAKE[@]}" OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_LOCAL_SIZE=1 "$K" calibrate --device cuda --small -o "$tmp/b.profile" 2>&1)
rc=$?
check "ranks on two hosts are refused (the links are one node's): one line ($out)" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [[ \"\$out\" == *'run every rank on one host (2 ranks, 1 on this one)'* ]]"
cp "$K" "$tmp/kiln"
out=$("$tmp/kiln" calibrate --device cuda -o "$tmp/b.profile" 2>&1)
rc=$?
check "no kiln-calibrate-cuda beside kiln: one line ($out)" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [[ \"\$out\" == *'kiln-calibrate-cuda: No such file or directory (make builds it beside kiln)' ]]"
out=$("${FAKE[@]}" "$B/kiln-calibrate-cuda" -o "$tmp/b.profile" 2>&1)
check "the program alone without --cubins: its usage ($out)" "[[ \"\$out\" == 'kiln: calibrate --device cuda: usage: kiln-calibrate-cuda --cubins DIR'* ]]"
check "nothing written on errors" "[ ! -e '$tmp/b.profile' ]"
echo "1..$n"
