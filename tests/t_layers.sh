#!/usr/bin/env bash
# The layers of docs/architecture.md, checked on the sources and the built
# objects: the IR layer includes no pass and nothing of runtime/, no pass
# calls a function defined in another pass's file, the runtime and kernels
# include no compiler header.  Each rule is first run on a planted violation
# so that it can fail.
. "$(dirname "$0")/lib.sh"

IR_LAYER="compiler/ir.h compiler/ir.c compiler/live.h compiler/live.c compiler/verify.c compiler/irtext.c"
# the passes by object; parallelize and cp are one pass, schedule and lhs another
PASSES="autodiff parallelize+cp recompute pp optimizer precision fuse schedule+lhs memplan forward"
# the analyses a pass may call in another pass's file: declared in that
# pass's header on a const Graph, they change nothing (docs/architecture.md)
ANALYSES="memplan_stage_total pp_actions"

# ir_includes FILES: the quoted includes of FILES that are not the IR layer's own
ir_includes() {
    grep -H -o -E '#include +"[^"]+"' "$@" | grep -v -E '"(ir\.h|live\.h|ops\.def)"$'
}
# cross_calls OBJDIR: "A calls B's f" for every function a pass's object
# needs that another pass's object defines
cross_calls() {
    local dir=$1 p q
    for p in $PASSES; do
        for q in $PASSES; do
            [ "$p" = "$q" ] && continue
            comm -12 <(for o in ${p//+/ }; do nm "$dir/$o.o" | awk '$1 == "U" {print $2}'; done | sort -u) \
                     <(for o in ${q//+/ }; do nm "$dir/$o.o" | awk '$2 == "T" {print $3}'; done | sort -u) |
                grep -v -x -F "${ANALYSES// /$'\n'}" |
                sed "s/^/$p calls $q's /"
        done
    done
}
# compiler_includes DIRS: includes of a compiler header under DIRS
compiler_includes() {
    local names
    names=$(cd compiler && find . -name '*.h' -printf '%f\n' | sort -u | sed 's/\./\\./' | paste -sd'|')
    grep -r -n -E "#include +\"([^\"]*/)?($names)\"|#include +\"(\.\./)+compiler/" --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' "$@"
}

# ---- planted violations ----
mkdir -p "$tmp/ir" "$tmp/obj" "$tmp/rt"
printf '#include "ir.h"\n#include "memplan.h"\n' > "$tmp/ir/bad.c"
check "planted: an IR-layer file that includes memplan.h is caught" "ir_includes '$tmp/ir/bad.c' | grep -q memplan.h"
for p in autodiff parallelize cp recompute pp optimizer precision fuse schedule lhs memplan forward; do
    printf 'void pass_%s_fn(void) {}\n' "$p" > "$tmp/obj/$p.c"
done
printf 'void pass_fuse_fn(void);\nvoid pass_schedule_fn(void) { pass_fuse_fn(); }\n' > "$tmp/obj/schedule.c"
for f in "$tmp"/obj/*.c; do cc -c "$f" -o "${f%.c}.o"; done
check "planted: schedule calling a function of fuse.c is caught" "cross_calls '$tmp/obj' | grep -q \"schedule+lhs calls fuse's pass_fuse_fn\""
printf '#include "memplan.h"\n' > "$tmp/rt/bad.c"
check "planted: a runtime file that includes a compiler header is caught" "compiler_includes '$tmp/rt' | grep -q memplan.h"

# ---- the tree ----
ir_includes $IR_LAYER > "$tmp/ir.txt"
check "the IR layer ($(echo $IR_LAYER | wc -w) files) includes only ir.h, live.h and ops.def$(sed 's/^/; /' "$tmp/ir.txt" | tr -d '\n')" "[ ! -s '$tmp/ir.txt' ]"
make -s -j2 BUILD="$B" $(for p in $PASSES; do for o in ${p//+/ }; do echo "$B/compiler/$o.o"; done; done) > /dev/null
cross_calls "$B/compiler" > "$tmp/calls.txt"
for f in $ANALYSES; do
    check "the analysis $f is declared on a const Graph" "grep -h -E '^[a-z0-9_ ]+[ *]$f\\(const Graph \\*' compiler/*.h | grep -q ."
done
check "no pass calls a function defined in another pass's file$(sed 's/^/; /' "$tmp/calls.txt" | tr -d '\n')" "[ ! -s '$tmp/calls.txt' ]"
compiler_includes runtime kernels > "$tmp/rt.txt"
check "runtime/ and kernels/ include no compiler header$(sed 's/^/; /' "$tmp/rt.txt" | tr -d '\n')" "[ ! -s '$tmp/rt.txt' ]"
echo "1..$n"
