#!/usr/bin/env bash
# bench/tp_vs_cp.sh — tensor parallel vs context parallel vs data parallel on
# 4 CPU ranks (issue 20): the same model (tiny.lua at dim DIM, LAYERS
# layers, HEADS heads, global batch BATCH) trained for STEPS steps as
# `--tp 4` (sequence parallel), `--cp 4 --cp-comm p2p` (ring attention) and
# `--dp 4`, at two sequence lengths (SEQS).  Per run: the median tokens/s
# over steps 2..STEPS and the bytes each rank sent per step, both as the
# trainer logs them (`tokens_per_s`, `comm_bytes`: the runtime's count of
# what its collectives and sends moved).  Prints the machine's load first:
# on a shared machine the times are noisy, the bytes are not.
#   STEPS=6 SEQS="128 512" bash bench/tp_vs_cp.sh
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-6} SEQS=${SEQS:-"128 512"}
DIM=${DIM:-128} LAYERS=${LAYERS:-2} HEADS=${HEADS:-4} BATCH=${BATCH:-4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
make -s "$B/kiln" BUILD="$B" > /dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 README.md > "$tmp/data.txt"
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "tp_vs_cp ($(date -u '+%F %H:%M UTC')): tiny.lua dim $DIM, $LAYERS layers, $HEADS heads, batch $BATCH, $STEPS steps, 4 CPU ranks"
echo "load: $(uptime | sed 's/.*load average/load average/')"
printf '%6s %-22s %12s %16s\n' seq layout "tokens/s" "comm bytes/step"
for seq in $SEQS; do
    for layout in "--tp 4" "--cp 4 --cp-comm p2p" "--dp 4"; do
        bin=$tmp/t_${seq}_${layout// /_}
        # shellcheck disable=SC2086 # the layout is words
        if ! "$B/kiln" compile models/tiny.lua --set dim="$DIM" --set layers="$LAYERS" --set heads="$HEADS" \
            --set batch="$BATCH" --set seq="$seq" $layout --target cpu -o "$bin" > "$tmp/log" 2>&1; then
            echo "compile $layout at seq $seq failed: $(head -c 300 "$tmp/log")" >&2
            exit 1
        fi
        if ! timeout 900 mpirun -np 4 --oversubscribe "$bin" --data "$tmp/data.txt" --steps "$STEPS" --log "$tmp/run.log" \
            > "$tmp/out" 2>&1; then
            echo "$layout at seq $seq: the trainer failed: $(tail -3 "$tmp/out" | tr '\n' ' ')" >&2
            exit 1
        fi
        tps=$(sed -n '2,$s/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p' "$tmp/run.log" | median)
        comm=$(sed -n '1s/.*"comm_bytes":\([0-9]*\).*/\1/p' "$tmp/run.log")
        printf '%6d %-22s %12s %16s\n' "$seq" "$layout" "$tps" "$comm"
    done
done
