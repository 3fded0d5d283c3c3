#!/usr/bin/env python3
"""tests/st.py — safetensors files for tests/t_pretrained.sh, by hand
(json header + raw little-endian f32; the standard library only).

  hf-gpt2 SRC DST ROWS       SRC's params as a Hugging Face GPT-2 file:
                             bare names, no opt./trainer. entries, wte cut
                             to ROWS rows and doubled, GPT-2's attn.bias
                             buffers added
  params-only SRC DST K      SRC's params (no opt./trainer.), times K
  constant SRC DST ID        SRC's GPT-2 params zeroed but ln_f.bias[0] = 1
                             and wte[ID][0] = 10: whatever the input, the
                             logits are 10 at ID and 0 elsewhere
  expect-padded GOT W0 ROWS  exit 0 iff GOT's wte rows < ROWS are 2*W0's,
                             its other rows and every other param W0's
  expect-scaled GOT W0 K     exit 0 iff every param of GOT is K*W0's
("is": within close()'s bound).
A checkpoint's "transformer." prefix is dropped when reading."""
import json, struct, sys
from array import array


class T:
    """A tensor: shape and flat f32 values (array('f'), little-endian host)."""

    def __init__(self, shape, v):
        self.shape, self.v = list(shape), v

    def rows(self, n):
        row = len(self.v) // self.shape[0]
        return T([n] + self.shape[1:], self.v[:n * row])

    def scaled(self, k):
        return T(self.shape, array("f", (k * x for x in self.v)))


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    head = json.loads(blob[8:8 + n])
    out = {}
    for name, e in head.items():
        if name == "__metadata__" or name.startswith(("opt.", "trainer.")):
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        out[key] = T(e["shape"], array("f", blob[8 + n + a:8 + n + b]))
    return out


def write(path, tensors):
    head, off, parts = {}, 0, []
    for name, t in tensors.items():
        b = t.v.tobytes()
        head[name] = {"dtype": "F32", "shape": t.shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        parts.append(b)
    h = json.dumps(head).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(parts))


def params(t):
    return {k: v for k, v in t.items() if not k.startswith(("opt.", "trainer."))}


def close(got, want):
    """Equal up to the one step at lr 1e-30 that wrote the checkpoints: it
    moves a zero bias by about 1e-30 and no weight of size 1e-3 at all."""
    return got.shape == want.shape and all(abs(g - w) <= 1e-6 * abs(w) + 1e-25 for g, w in zip(got.v, want.v))


def main(cmd, *a):
    if cmd == "hf-gpt2":
        p, rows = params(read(a[0])), int(a[2])
        p["wte.weight"] = p["wte.weight"].rows(rows).scaled(2)
        for k in [k for k in p if k.endswith(".attn.c_attn.weight")]:
            p[k[:-len("c_attn.weight")] + "bias"] = T([1, 1, 2, 2], array("f", [1, 0, 1, 1]))
        write(a[1], p)
        return 0
    if cmd == "constant":
        p = {k: T(v.shape, array("f", bytes(4 * len(v.v)))) for k, v in params(read(a[0])).items()}
        p["ln_f.bias"].v[0] = 1
        wte = p["wte.weight"]
        wte.v[int(a[2]) * (len(wte.v) // wte.shape[0])] = 10
        write(a[1], p)
        return 0
    if cmd == "params-only":
        write(a[1], {k: v.scaled(float(a[2])) for k, v in params(read(a[0])).items()})
        return 0
    got, w0 = params(read(a[0])), params(read(a[1]))
    if got.keys() != w0.keys():
        return 1
    if cmd == "expect-padded":
        rows = int(a[2])
        want = dict(w0)
        wte = w0["wte.weight"]
        cut = len(wte.v) // wte.shape[0] * rows
        want["wte.weight"] = T(wte.shape, wte.rows(rows).scaled(2).v + wte.v[cut:])
    else:
        want = {k: v.scaled(float(a[2])) for k, v in w0.items()}
    bad = [k for k in want if not close(got[k], want[k])]
    for k in bad:
        print(f"st.py: {k} differs", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
