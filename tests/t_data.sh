#!/usr/bin/env bash
# Datasets: `kiln data` turns the demo corpus into llm.c token shards, the
# compiled tiny trainer trains on a glob of them, validation leaves training
# bit-identical, and bad input stops `kiln data` and the trainer with one
# line naming the file, writing nothing over.
. "$(dirname "$0")/lib.sh"
need_corpus
DATA=("$K" data)
P=$tmp/corpus
"${DATA[@]}" "$B/corpus.txt" -o "$P" --shard-tokens 50000 > "$tmp/out"; rc=$?
check "kiln data writes train and val shards (rc=$rc)" "[ $rc = 0 ] && [ -e ${P}_train_000000.bin ] && [ -e ${P}_train_000001.bin ] && [ -e ${P}_val_000000.bin ]"
check "no temporary files left" "! ls $tmp/*.tmp >/dev/null 2>&1"
check "the shards hold the corpus's bytes, in order (90% train, 10% val)" "python3 - '$B/corpus.txt' $P <<'PY'
import glob, struct, sys
data, toks = open(sys.argv[1], 'rb').read(), []
for split in ('train', 'val'):
    for f in sorted(glob.glob(sys.argv[2] + '_' + split + '_*.bin')):
        d = open(f, 'rb').read()
        magic, version, count = struct.unpack('<3i', d[:12])
        assert magic == 20240520 and version == 1 and len(d) == 1024 + 2 * count and count <= 50000, f
        toks += struct.unpack('<%dH' % count, d[1024:])
    if split == 'train': ntrain = len(toks)
assert bytes(toks) == data and ntrain == len(data) - round(0.1 * len(data))
PY"

"$K" compile models/tiny.lua --target cpu -o "$tmp/tiny" > /dev/null
"$tmp/tiny" --data "${P}_train_*.bin" --steps 20 --log "$tmp/a.jsonl" > /dev/null; rc=$?
first=$(head -1 "$tmp/a.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(tail -1 "$tmp/a.jsonl" | sed 's/.*"loss":\([^,]*\),.*/\1/')
check "the tiny trainer trains on a glob of shards (rc=$rc, loss $first -> $last)" "[ $rc = 0 ] && awk 'BEGIN{exit !($last < $first - 1)}'"
"$tmp/tiny" --data "${P}_train_*.bin" --steps 20 --val "${P}_val_*.bin" --val-every 5 --log "$tmp/b.jsonl" > /dev/null; rc=$?
strip() { sed -e 's/"val_loss":[^,]*,//' -e 's/,"tokens_per_s.*//' "$1"; }
check "validation every 5 steps: 4 val losses in the log (rc=$rc)" "[ $rc = 0 ] && [ \$(grep -c val_loss $tmp/b.jsonl) = 4 ]"
check "validation leaves the training losses bit-identical" "cmp -s <(strip $tmp/a.jsonl) <(strip $tmp/b.jsonl)"
"$tmp/tiny" --data "$B/corpus.txt" --steps 3 > /dev/null; rc=$?
check "a text file still trains (rc=$rc)" "[ $rc = 0 ]"

# bad input: one line naming the file, non-zero exit, nothing written over
sum_before=$(cat ${P}_*.bin | md5sum)
one_line() { [ "$1" != 0 ] && [ "$(printf '%s\n' "$2" | wc -l)" = 1 ] && [[ "$2" == *"$3"* ]]; }
err=$("${DATA[@]}" "$B/corpus.txt" "$tmp/missing.txt" -o "$P" 2>&1 >/dev/null); rc=$?
check "kiln data: a missing input is one line naming it ($err)" "one_line $rc \"\$err\" missing.txt"
check "kiln data: nothing written over after bad input" "[ \"\$(cat ${P}_*.bin | md5sum)\" = \"$sum_before\" ] && ! ls $tmp/*.tmp >/dev/null 2>&1"
err=$("${DATA[@]}" "$B/corpus.txt" -o "$tmp/nodir/x" 2>&1 >/dev/null); rc=$?
check "kiln data: an unwritable output is one line naming it ($err)" "one_line $rc \"\$err\" nodir/x_train_000000.bin"
python3 -c "
import struct, sys
hdr = lambda m, v, c: struct.pack('<3i', m, v, c) + bytes(1024 - 12)
toks = struct.pack('<200H', *range(200))
open('$tmp/magic.bin', 'wb').write(hdr(1234, 1, 200) + toks)
open('$tmp/trunc.bin', 'wb').write(hdr(20240520, 1, 300) + toks)
open('$tmp/vocab.bin', 'wb').write(hdr(20240520, 1, 200) + struct.pack('<200H', *[300] * 200))
"
for bad in magic:"wrong magic 1234" trunc:truncated; do
    f=${bad%%:*} want=${bad#*:}
    err=$("$tmp/tiny" --data "$tmp/$f.bin" --steps 2 2>&1 >/dev/null); rc=$?
    check "trainer: $f.bin is one line naming the file ($err)" "one_line $rc \"\$err\" \"$tmp/$f.bin: $want\""
done
err=$("$tmp/tiny" --data "${P}_train_*.bin" --val "$tmp/nothing_*.bin" --val-every 5 --steps 2 2>&1 >/dev/null); rc=$?
check "trainer: a --val glob matching nothing is one line ($err)" "one_line $rc \"\$err\" '--val: no file matches'"
err=$("$tmp/tiny" --data "$tmp/vocab.bin" --steps 2 2>&1 >/dev/null); rc=$?
check "trainer: token id 300 >= vocabulary 256 stops the step with one line ($err)" "one_line $rc \"\$err\" 300"

# GPT-2 BPE: the shards decode back to the corpus, and an independent
# reference (encoder.py's algorithm on Python's stdlib `re`, with the
# ASCII-equivalent pattern) gives the same ids.  Skipped without the files
# (tools/fetch-gpt2-bpe.sh puts them in $B/gpt2-bpe).  The input is the
# corpus 8 times (1.1 MB): kiln data encodes it in 1 MB chunks.
G=$B/gpt2-bpe
if [ -s "$G/encoder.json" ] && [ -s "$G/vocab.bpe" ]; then
    Q=$tmp/bpe
    for k in 1 2 3 4 5 6 7 8; do cat "$B/corpus.txt"; done > "$tmp/big.txt"
    "${DATA[@]}" "$tmp/big.txt" -o "$Q" --bpe "$G" --shard-tokens 20000 > "$tmp/out"; rc=$?
    check "kiln data --bpe writes v1 shards (rc=$rc: $(cat $tmp/out))" "[ $rc = 0 ] && [ -e ${Q}_train_000001.bin ] && [ -e ${Q}_val_000000.bin ] && grep -q 'vocabulary 50257' $tmp/out"
    check "the BPE shards decode to the corpus exactly; the ids equal a Python reference's" "/usr/bin/python3 - $tmp/big.txt $Q $G <<'PY'
import glob, json, re, struct, sys
text, prefix, g = open(sys.argv[1], 'rb').read(), sys.argv[2], sys.argv[3]
ids = []
for split in ('train', 'val'):
    for f in sorted(glob.glob(prefix + '_' + split + '_*.bin')):
        d = open(f, 'rb').read()
        magic, version, count = struct.unpack('<3i', d[:12])
        assert magic == 20240520 and version == 1 and len(d) == 1024 + 2 * count and count <= 20000, f
        ids += struct.unpack('<%dH' % count, d[1024:])
# GPT-2's bytes_to_unicode
bs = list(range(33, 127)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs = bs[:] + [256 + k for k in range(256 - len(bs))]
bs += [b for b in range(256) if b not in bs]
byte_enc = dict(zip(bs, map(chr, cs)))
byte_dec = {c: b for b, c in byte_enc.items()}
encoder = json.load(open(g + '/encoder.json'))
decoder = {v: k for k, v in encoder.items()}
back = bytes(byte_dec[c] for i in ids for c in decoder[i])
assert back == text, 'decoded text differs from the corpus'
# the reference encoder: encoder.py, with the ASCII pattern (the corpus is ASCII)
merges = [tuple(l.split()) for l in open(g + '/vocab.bpe', encoding='utf-8').read().split('\n')[1:-1]]
ranks = dict(zip(merges, range(len(merges))))
pat = re.compile(r\"\"\"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+\"\"\", re.ASCII)
cache = {}
def bpe(word):
    if word in cache: return cache[word]
    w = tuple(word)
    while len(w) > 1:
        pairs = set(zip(w, w[1:]))
        first, second = min(pairs, key=lambda p: ranks.get(p, float('inf')))
        if (first, second) not in ranks: break
        out, i = [], 0
        while i < len(w):
            if i < len(w) - 1 and w[i] == first and w[i + 1] == second: out.append(first + second); i += 2
            else: out.append(w[i]); i += 1
        w = tuple(out)
    cache[word] = w
    return w
assert max(text) < 128
ref = [encoder[t] for tok in pat.findall(text.decode('ascii')) for t in bpe(''.join(byte_enc[b] for b in tok.encode()))]
assert ref == list(ids), 'ids differ from the reference at %d' % next(i for i, (a, b) in enumerate(zip(ref, ids)) if a != b)
PY"
    sum_before=$(cat ${Q}_*.bin | md5sum)
    err=$("${DATA[@]}" "$tmp/big.txt" -o "$Q" --encoder "$tmp/none.json" --vocab-bpe "$G/vocab.bpe" 2>&1 >/dev/null); rc=$?
    check "kiln data: a missing encoder.json is one line naming it, nothing written over ($err)" "one_line $rc \"\$err\" 'none.json: cannot open' && [ \"\$(cat ${Q}_*.bin | md5sum)\" = \"$sum_before\" ]"
else
    notok "kiln data --bpe: no GPT-2 BPE files in $G (make test fetches them: make bpe)"
fi
