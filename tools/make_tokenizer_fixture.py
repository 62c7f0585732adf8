#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/demo_ids.json: Python sentencepiece's token ids on the demo
corpus (data/demo, tools/make_demo_corpus.sh), the reference that tests/data/
tokenizer_reference_test.cpp holds our SentencePiece build to.

It records edge-case strings and the first documents of the validation file id for id, and for
whole files a digest: FNV-1a 64 over each document's ids as little-endian int32, each document
followed by -1. The demo model is named by the FNV-1a 64 of its .vocab (pieces and scores; the
.model also records the path it was trained from, which differs between checkouts).
Usage: tools/make_tokenizer_fixture.py  (after tools/setup.sh; rerun when the demo model changes)
"""
import gzip
import json
import os
import struct
import sys

import sentencepiece as spm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "data", "demo")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "demo_ids.json")
FULL_DOCUMENTS = 6  # of the validation file, id for id
DIGEST_FILES = ["c4-demo-validation.00000-of-00001.json.gz", "c4-demo-train.00000-of-00004.json.gz"]
# Byte fallback, split digits, runs of whitespace, tabs and newlines, the U+2581 meta symbol itself,
# combining marks, CJK, an empty string.
EDGE_STRINGS = [
    "The model learns from text.",
    "",
    " leading and trailing spaces ",
    "two  spaces,\tone tab,\n\nand two newlines",
    "digits 0123456789 and 3.14159e-10",
    "emoji \U0001F600\U0001F680 and symbols \u2192 \u00a9 \u20ac",
    "\u00fcn\u00efc\u00f6d\u00e9 and e\u0301 (combining acute)",
    "\u4e2d\u6587\u3001\u65e5\u672c\u8a9e\u3001\ud55c\uad6d\uc5b4",
    "a literal \u2581 meta symbol",
    "<bos> <eos> <pad> <unk> are text here",
]
FNV_OFFSET, FNV_PRIME, MASK = 14695981039346656037, 1099511628211, (1 << 64) - 1


def fnv1a64(data: bytes, h: int = FNV_OFFSET) -> int:
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & MASK
    return h


def texts(name):
    with gzip.open(os.path.join(DEMO, name), "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def digest(ids_per_document):
    h = FNV_OFFSET
    for ids in ids_per_document:
        h = fnv1a64(struct.pack(f"<{len(ids) + 1}i", *ids, -1), h)
    return f"fnv1a64:{h:016x}"


def main():
    model = os.path.join(DEMO, "tokenizer.model")
    if not os.path.exists(model):
        sys.exit(f"{model} is missing: run tools/setup.sh first")
    sp = spm.SentencePieceProcessor(model_file=model)
    with open(os.path.join(DEMO, "tokenizer.vocab"), "rb") as f:
        vocab_hash = f"fnv1a64:{fnv1a64(f.read()):016x}"
    validation = texts(DIGEST_FILES[0])
    fixture = {
        "made_by": "tools/make_tokenizer_fixture.py",
        "sentencepiece": spm.__version__,
        "vocab_fnv1a64": vocab_hash,
        "strings": [{"text": t, "ids": sp.encode(t)} for t in EDGE_STRINGS],
        "documents": [{"file": DIGEST_FILES[0], "index": i, "ids": sp.encode(t)}
                      for i, t in enumerate(validation[:FULL_DOCUMENTS])],
        "digests": [],
    }
    for name in DIGEST_FILES:
        ids = sp.encode(texts(name))
        fixture["digests"].append({"file": name, "documents": len(ids), "tokens": sum(map(len, ids)),
                                   "ids": digest(ids)})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(EDGE_STRINGS)} strings, {FULL_DOCUMENTS} documents, "
          f"{len(DIGEST_FILES)} file digests (sentencepiece {spm.__version__})")


if __name__ == "__main__":
    main()
