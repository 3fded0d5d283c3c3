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
