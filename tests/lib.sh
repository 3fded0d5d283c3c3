# tests/lib.sh — what the shell tests (tests/t_*.sh) share; each sources it
# first: `. "$(dirname "$0")/lib.sh"`.
#
# It runs the test from the repository's root (models/, kernels/ and tests/
# are named from there) and gives it:
#   B, K         the build folder ($BUILD, default build) and its kiln
#   n            the number of the last TAP line printed
#   check D E    "ok N - D" when the shell expression E succeeds, else "not ok N - D"
#   ok D, notok D   "ok N - D" / "not ok N - D"
#   say RC D     "ok N - D" when RC is 0, else "not ok N - D"
#   tmp          a temporary folder, removed when the test exits
#   need_corpus  makes $B/corpus.txt (the demo corpus) if it is not there
#   caught D ARGS...    `kiln check ARGS` (a planted bug) must report mismatches
#   bad_check WANT ARGS...  `kiln check ARGS` must fail with one line containing WANT
# tests/run.sh counts the "ok" and "not ok" lines.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
B=${BUILD:-build}
K=$B/kiln
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
notok() { n=$((n + 1)); echo "not ok $n - $*"; }
check() { if eval "$2"; then ok "$1"; else notok "$1"; fi; }
say() { if [ "$1" = 0 ]; then ok "$2"; else notok "$2"; fi; }
# (under a lock: tests/run.sh runs tests at once, and make writes it in place)
need_corpus() {
    (flock 8 && { [ -e "$B/corpus.txt" ] || make -s "$B/corpus.txt" BUILD="$B" > /dev/null; }) 8> "$B/.corpus.lock"
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The tests that train under mpirun (t_*_train.sh, t_offload_run.sh) start
# with need_mpi: Open MPI's settings (root allowed, shared memory),
#   MPI          "timeout 300 mpirun --oversubscribe"
#   D            "--data $B/corpus.txt --threads 1" (need_corpus)
# and one failed line, exit 1, when mpirun is missing (make test installs it).
need_mpi() {
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
    MPI="timeout 300 mpirun --oversubscribe"
    if ! command -v mpirun > /dev/null; then echo "not ok 1 - mpirun is not installed (make test installs Open MPI: tools/deps.sh)"; exit 1; fi
    need_corpus
    D="--data $B/corpus.txt --threads 1"
}
# Loss curves of two trainer logs (JSONL; a test may define its own):
#   losses LOG      the loss column
#   worst A B       the largest relative difference of the two columns
#   same A B LINES  both have LINES lines and worst <= 1e-5 (f32: only the
#                   summation order differs)
caught() { # what, kiln check args...: a planted bug the check must catch
    local what=$1 out; shift
    out=$("$K" check "$@" 2>&1)
    if [[ "$out" == *" mismatched"* ]] && [[ "$out" != *", 0 mismatched"* ]]; then ok "$what fails the check: ${out##*, }"
    else notok "$what not caught: $out"; fi
}
bad_check() { # want, kiln check args...: one line containing want, exit != 0
    local want=$1 out rc; shift
    out=$("$K" check "$@" 2>&1); rc=$?
    if [ $rc != 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [[ "$out" == *"$want"* ]]; then ok "bad: $want: $out"
    else notok "bad $*: rc=$rc want '$want': $out"; fi
}
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
worst() { paste <(losses "$1") <(losses "$2") | awk 'function abs(x){return x<0?-x:x} {d=abs($1-$2)/abs($2); if(d>w)w=d} END{printf "%.3g", w+0}'; }
same() { # log a, log b, lines
    [ "$(wc -l < "$1")" = "$3" ] && [ "$(wc -l < "$2")" = "$3" ] && awk -v w="$(worst "$1" "$2")" 'BEGIN{exit !(w <= 1e-5)}'
}
