#!/usr/bin/env bash
# bench/gpu/profile.sh — where kiln's GPT-2 step spends its time on a GPU (issue 23).
#
# The second call for a lent GPU, after check.sh: the bundle's GPT-2
# trainers (default attention, --attention tc, --gemm-epilogue all) run
# STEPS traced steps each (eager, CUDA events around every launch: the
# times are the GPU's), and bench/gpu/trace_top.py prints per step the
# span, the busy share and the launches by total time.  Then PyTorch
# eager and torch.compile on the same model for the peer's step time.
# Leaves profile.txt and the traces (gzipped) under $OUT.  Settings:
# STEPS (4), TRAINERS (the bundle's binaries to trace), TORCH_MODES
# ("eager compile"; empty: no PyTorch).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
G=${BUNDLE:-bench/gpu/out}
OUT=${OUT:-$G/profile-$(date -u +%Y%m%d-%H%M%S)}
STEPS=${STEPS:-4}
PY=${PYTHON:-python3}
mkdir -p "$OUT" || exit 2
. "$G/manifest.env" || exit 2
KLD=$G/lib
for d in /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu; do [ -d "$d" ] && KLD=$KLD:$d; done
for w in $("$PY" -c 'import glob,site,os; [print(os.path.dirname(p)) for s in site.getsitepackages() for p in glob.glob(s+"/nvidia/*/lib/*.so*")]' 2> /dev/null | sort -u); do KLD=$KLD:$w; done
{
    echo "bench/gpu/profile.sh $(date -u '+%F %T') UTC, kiln $KILN_COMMIT, batch $BATCH seq $SEQ, $STEPS traced steps (the first dropped)"
    echo; echo "== the cuDNN libraries on this machine (kiln's graphs need 9.16)"
    find / -xdev -name 'libcudnn.so.9*' -not -type l 2> /dev/null | head -8
    "$PY" -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1
    for b in ${TRAINERS:-gpt2_cuda gpt2_tc_cuda gpt2_ep_cuda}; do
        [ -x "$G/bin/$b" ] || continue
        echo; echo "== $b"
        timeout -k 5 120 env LD_LIBRARY_PATH="$KLD" "$G/bin/$b" --data "$G/$GPT2_DATA" --steps "$STEPS" --seed 1337 \
            --print-every 1 --trace "$OUT/$b.json" > "$OUT/$b.out" 2>&1 || { echo "exit $?:"; tail -3 "$OUT/$b.out"; continue; }
        grep '^step' "$OUT/$b.out" | tail -2
        "$PY" bench/gpu/trace_top.py "$OUT/$b.json" "$STEPS"
        gzip -f "$OUT/$b.json"
    done
    for mode in ${TORCH_MODES-eager compile}; do
        echo; echo "== torch $mode"
        timeout -k 10 200 "$PY" bench/gpu/gpt2_torch.py --data "$G/$GPT2_DATA" --mode $mode --batch "$BATCH" --seq "$SEQ" \
            --warmup "$WARM" --steps 10 2> "$OUT/torch_$mode.log" | tail -1 || tail -3 "$OUT/torch_$mode.log"
    done
} 2>&1 | tee "$OUT/profile.txt"
