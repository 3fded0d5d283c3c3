#!/usr/bin/env bash
# kiln plot --trace on real trace files: a 2-rank data-parallel trainer
# (mpirun -np 2, --trace writes FILE and FILE.rank1) gives an SVG that parses,
# with one row per file, every compute kernel of the drawn step as a block,
# the step count the trainer ran, and the compute stream's idle fraction
# equal (to the printed 0.1%) to an independent reading of the JSON by
# python3.  A trace cut short, or one that is missing, gives one line naming
# the file and exit 1.  (The planned pipeline picture, plot_pp_timeline, is
# tested in tests/test_plot.c on hand-built plans.)
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
if ! command -v mpirun > /dev/null; then echo "not ok 1 - mpirun is not installed (make test installs Open MPI: tools/deps.sh)"; exit 1; fi
need_corpus
"$K" compile models/tiny.lua --set layers=1 --dp 2 --micro-batches 2 -o "$tmp/dp2" > /dev/null
# under SAN=1: Open MPI's own allocations (MPI_Init's plugins) are still held
# at exit (as t_mpi.sh's nolsan); ASan and UBSan stay on
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" timeout 300 mpirun --oversubscribe -np 2 "$tmp/dp2" --data "$B/corpus.txt" \
    --threads 1 --steps 3 --trace "$tmp/tr.json" > /dev/null 2>&1
rc=$?
check "the 2-rank trainer exits 0 ($rc) and wrote two traces" "[ $rc = 0 ] && [ -s $tmp/tr.json ] && [ -s $tmp/tr.json.rank1 ]"

"$K" plot --trace "$tmp/tr.json" "$tmp/tr.json.rank1" -o "$tmp/tl.svg" 2> "$tmp/err"
say $? "kiln plot --trace A B -o OUT.svg ($(head -c 200 "$tmp/err"))"
check "the SVG parses" "python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' $tmp/tl.svg"
rows=$(grep -c '<rect class="row"' "$tmp/tl.svg")
check "one row per file ($rows)" "[ $rows = 2 ]"
title=$(sed -n 's/.*class="title"[^>]*>\([^<]*\)<.*/\1/p' "$tmp/tl.svg")
check "the title names the last of the 3 steps ($title)" "[[ '$title' == *'step 3 of 3'* ]]"

# the reference: steps split where a compute kernel (tid 0) follows an opt
# one; a rank's step runs from its first event on any stream after the
# previous step's last compute kernel to its last compute kernel's end;
# idle = 1 - sum of busy / (ranks x the longest step)
ref=$(python3 - "$tmp/tr.json" "$tmp/tr.json.rank1" <<'PY'
import json, sys
busy, spans, kernels = 0.0, [], 0
for path in sys.argv[1:]:
    ev = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X"]
    phase = lambda e: e.get("args", {}).get("at", "").split(" ")[0]
    comp = sorted((e for e in ev if e["tid"] == 0), key=lambda e: e["ts"])
    other = [e for e in ev if e["tid"] != 0]
    steps = [[]]
    for i, e in enumerate(comp):
        if i and phase(comp[i - 1]) == "opt" and phase(e) != "opt": steps.append([])
        steps[-1].append(e)
    prev = max(e["ts"] + e["dur"] for e in steps[-2])
    last = steps[-1]
    start = min([last[0]["ts"]] + [e["ts"] for e in other if prev < e["ts"] < last[0]["ts"]])
    end = max(e["ts"] + e["dur"] for e in last)
    busy += sum(e["dur"] for e in last)
    spans.append(end - start)
    kernels += len(last)
print("%.4f %d" % (100 * (1 - busy / (len(spans) * max(spans))), kernels))
PY
)
want=${ref% *}
got=$(printf '%s' "$title" | sed -n 's/.*compute idle \([0-9.]*\)%.*/\1/p')
check "compute idle in the title ($got%) == python's reading of the traces ($want%, 0.05 tolerance)" \
    "awk -v a='$got' -v b='$want' 'BEGIN{d=a-b; exit !(a != \"\" && d <= 0.05 && d >= -0.05)}'"
blocks=$(grep -c '<rect class="kernel' "$tmp/tl.svg")
check "a block per compute kernel of the step ($blocks, python counts ${ref#* })" "[ '$blocks' = '${ref#* }' ]"

# a trace cut short and a missing one: one line naming the file, exit 1
head -c 3000 "$tmp/tr.json" > "$tmp/cut.json"
err=$("$K" plot --trace "$tmp/cut.json" "$tmp/tr.json.rank1" -o "$tmp/bad.svg" 2>&1); rc=$?
check "a cut trace: rc 1, one line naming it ($err)" "[ $rc = 1 ] && [ \$(printf '%s\n' \"\$err\" | wc -l) = 1 ] && [[ \"\$err\" == *'$tmp/cut.json: not a trace'* ]]"
err=$("$K" plot --trace "$tmp/tr.json" "$tmp/nope.json" -o "$tmp/bad.svg" 2>&1); rc=$?
check "a missing trace: rc 1, one line naming it ($err)" "[ $rc = 1 ] && [ \$(printf '%s\n' \"\$err\" | wc -l) = 1 ] && [[ \"\$err\" == *'$tmp/nope.json'* ]]"
check "no SVG written on error" "[ ! -e $tmp/bad.svg ]"
