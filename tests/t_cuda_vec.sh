#!/usr/bin/env bash
# The generated elementwise kernels' vector loop (compiler/emit/emit_cuda.c:
# 8 elements per thread and iteration, 16-byte loads and stores, when every
# array read or written at element i is 16-byte aligned; the scalar loop
# takes the rest) gives the same bits as the scalar loop alone.
#  1. the text: tiny.lua's kernels have the vector loop (16-byte vector
#     loads of kiln_bf16x8) and the scalar loop after it;
#  2. two shapes on the fake CUDA stack (tests/cuda_fake, strict), 3 steps
#     each: tiny.lua at batch 2, seq 32 (every n a multiple of 8: the vector
#     loop does all, broadcasts of a bias by the per-vector index) and at
#     dim 36, batch 1, seq 33 (n = 1188: the scalar loop takes a 4-element
#     tail; a bias of 36 is not a multiple of 8, so its index is computed per
#     element).  The registry built from the text as emitted and one built
#     from a copy whose alignment test never passes (only the scalar loop
#     runs, which is the old kernel's loop) must give the same losses and
#     gradient norms, bit for bit (printed %.9g: exact for f32);
#  3. able to fail: a copy whose vector loop reads the elements of its
#     first vector input in reverse order (v0.v[7 - e]) must give other
#     losses.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
cuda_fakes || build_failed "the fakes or the library kernels' registry"

# variant NAME SED: a registry built from $tmp/$base.cu edited by SED
variant() {
    sed "$2" "$tmp/$base.cu" > "$tmp/$base.$1.cu" &&
        tests/cuda_fake/build_kernels.sh "$tmp/$base.$1.cu" -o "$F/${base}_$1.so" >> "$tmp/log" 2>&1
}

for shape in "--set batch=2 --set seq=32" "--set dim=36 --set batch=1 --set seq=33"; do
    base=vec$(echo "$shape" | tr -dc '0-9')
    # shellcheck disable=SC2086
    cuda_trainer "$base" "${base}_gen" models/tiny.lua $shape || build_failed "tiny.lua $shape for cuda:sm_90"
    if [ "$base" = vec232 ]; then
        check "the text has the vector loop (16-byte loads of bf16 inputs) and then the scalar loop" \
            "grep -q 'const kiln_bf16x8 v[0-9]* = ((const kiln_bf16x8 \*)in[0-9]*)\[q\];' '$tmp/$base.cu' &&
             grep -q 'for (unsigned long long i = first + ' '$tmp/$base.cu'"
    fi
    variant scalar 's/) \& 15) == 0) {/) \& 15) == 16) {/' || build_failed "the scalar-only registry"
    variant planted 's/v0\.v\[e\]/v0.v[7 - e]/' || build_failed "the planted registry"
    check "(the scalar-only copy has no vector loop that can run)" "! grep -q '& 15) == 0)' '$tmp/$base.scalar.cu'"
    fake_run "$tmp/$base" "$base.vec" "$F/libkernels.so:$F/${base}_gen.so" 3
    rv=$?
    fake_run "$tmp/$base" "$base.scalar" "$F/libkernels.so:$F/${base}_scalar.so" 3
    rs=$?
    check "tiny.lua $shape: vector and scalar loops give the same losses and gradient norms, bit for bit ($(cut -d' ' -f1 "$tmp/$base.vec.loss" | tr '\n' ' '))" \
        "[ $rv = 0 ] && [ $rs = 0 ] && [ \$(wc -l < '$tmp/$base.vec.loss') = 3 ] && cmp -s '$tmp/$base.vec.loss' '$tmp/$base.scalar.loss'"
    fake_run "$tmp/$base" "$base.planted" "$F/libkernels.so:$F/${base}_planted.so" 3
    check "tiny.lua $shape: the planted reversed vector load changes the losses ($(cut -d' ' -f1 "$tmp/$base.planted.loss" | tr '\n' ' '))" \
        "[ -s '$tmp/$base.planted.loss' ] && ! cmp -s '$tmp/$base.vec.loss' '$tmp/$base.planted.loss'"
done
echo "1..$n"
