#!/usr/bin/env bash
# bench/cpu_vs_torch.sh — kiln's compiled CPU trainer against PyTorch on the
# same CPU, same model, same thread count, measured in the same run.
#   GPT: 4 layers, 4 heads, dim 256, seq 256, batch 8, vocab 256, AdamW
#   (betas 0.9/0.95, clip 1.0) at the same constant LR and weight decay WD on
#   both sides (PyTorch: foreach=True, decay on matrices only, as kiln).
# Both sides time STEPS steps after 2 warm-up steps and report tokens/s as
# total tokens over total step time (kiln: the harmonic mean of its per-step
# tokens_per_s; GFLOP/s likewise, model FLOPs: recompute not counted).
# Prints tokens/s of both and the ratio (target kiln >= 1.5x), and kiln's
# achieved GFLOP/s over OpenBLAS sgemm's rate on this machine (target >= 70%).
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-10}
THREADS=${THREADS:-$(nproc)}
LR=${LR:-3e-4}
WD=${WD:-0.1}
SHAPE="--set layers=4 --set heads=4 --set dim=256 --set seq=256 --set batch=8"
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" >/dev/null
# shellcheck disable=SC2086
"$B/kiln" compile models/tiny.lua --target cpu $SHAPE --lr "$LR" --min-lr "$LR" --warmup 0 --weight-decay "$WD" -o "$B/bench_gpt"
log=$(mktemp); trap 'rm -f "$log"' EXIT
"$B/bench_gpt" --data "$B/corpus.txt" --steps $((STEPS + 2)) --threads "$THREADS" --log "$log" > /dev/null
# skip the first two (warm-up) steps, as the torch side does; every step has
# the same tokens and FLOPs, so total over total time is the harmonic mean
read -r kiln_tps kiln_gflops < <(tail -n +3 "$log" | sed 's/.*"tokens_per_s":\([^,]*\),"gflops":\([^,]*\),.*/\1 \2/' |
    awk '{t += 1 / $1; g += 1 / $2; n++} END {printf "%.1f %.2f\n", n / t, n / g}')
torch_line=$(/usr/bin/python3 bench/torch_gpt.py "$B/corpus.txt" 4 4 256 256 8 "$STEPS" "$THREADS" "$LR" "$WD")
torch_tps=$(echo "$torch_line" | awk '{print $3}')
sgemm=$(OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS /usr/bin/python3 -c '
import numpy as np, time
n = 1024; a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)
a @ b; t = time.perf_counter(); k = 20
for _ in range(k): a @ b
print(f"{2 * n**3 * k / (time.perf_counter() - t) / 1e9:.2f}")')
echo "cpu_vs_torch ($(date -u +%F), $(nproc) cores, $THREADS threads, $STEPS timed steps)"
printf '%-28s %10s tok/s\n' "kiln compiled trainer" "$kiln_tps" "PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')" "$torch_tps"
awk -v k="$kiln_tps" -v t="$torch_tps" 'BEGIN {printf "%-28s %10.2fx  (target >= 1.5x)\n", "kiln / PyTorch", k / t}'
awk -v g="$kiln_gflops" -v s="$sgemm" 'BEGIN {printf "%-28s %10.2f GFLOP/s = %.0f%% of OpenBLAS sgemm (%.2f GFLOP/s; target >= 70%%)\n", "kiln achieved", g, 100 * g / s, s}'
