#!/usr/bin/env python3
"""How documents mix in packed windows: what document masking (data.document_masking) has to do.

For windows of W tokens tiling a split's framed document stream (each document `[BOS] doc EOS`,
--frame 2, as the loader frames them; cut to its first N tokens where --cut N is given, as
`darkformer prepare --max-document-tokens N` would), it prints per window size and cut: the mean
document length, the documents a window holds parts of, and the share of its causal pairs (a key at
or before its query) whose two tokens lie in different documents, the pairs masking removes.

    tools/document_mix.py --shards data/c4/shards --window 512 --window 2048 --cut 0 --cut 128

Reads only the shards' `.docs` offsets (docs/data.md, "Output files"). Bad input exits 2 naming it."""

import argparse
import glob
import json
import os
import sys

import numpy as np

DOCS_MAGIC = b"DFDOCv1\0"


def fail(message):
    print("document_mix: " + message, file=sys.stderr)
    sys.exit(2)


def document_lengths(shards, split):
    """The split's document lengths in stream order (shard by shard, as named)."""
    if not os.path.isdir(shards):
        fail("--shards %s is not a folder" % shards)
    paths = sorted(glob.glob(os.path.join(shards, "shard-*.%s.docs" % split)))
    if not paths:
        fail("%s holds no shard-*.%s.docs files" % (shards, split))
    lengths = []
    for path in paths:
        with open(path, "rb") as f:
            header = f.read(16)
            if len(header) < 16 or header[:8] != DOCS_MAGIC:
                fail("%s: not a documents file (its header is not %r)" % (path, DOCS_MAGIC))
            count = int.from_bytes(header[8:], "little")
            offsets = np.frombuffer(f.read(), dtype="<u8").astype(np.int64)
        if len(offsets) != count + 1 or np.any(np.diff(offsets) < 0):
            fail("%s: %d offsets for %d documents, or offsets that decrease" % (path, len(offsets), count))
        lengths.append(np.diff(offsets))
    return np.concatenate(lengths)


def mix(framed, window):
    """Mean documents per window and the share of causal pairs across documents, over the whole
    windows that tile the stream of framed lengths."""
    doc_of_token = np.repeat(np.arange(len(framed)), framed)
    windows = len(doc_of_token) // window
    if windows == 0:
        fail("--window %d is longer than the stream (%d tokens)" % (window, len(doc_of_token)))
    same, parts = 0, 0
    for w in range(windows):
        _, counts = np.unique(doc_of_token[w * window:(w + 1) * window], return_counts=True)
        same += int((counts * (counts + 1) // 2).sum())
        parts += len(counts)
    pairs = windows * window * (window + 1) // 2
    return parts / windows, 1 - same / pairs, windows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", required=True, help="a `darkformer prepare` output folder")
    parser.add_argument("--split", default="train", choices=("train", "val"))
    parser.add_argument("--window", type=int, action="append", required=True, help="tokens per window (repeatable)")
    parser.add_argument("--cut", type=int, action="append", help="keep each document's first N tokens; 0: whole (repeatable)")
    parser.add_argument("--frame", type=int, default=2, help="tokens the loader adds per document (BOS and EOS: 2)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    cuts = args.cut or [0]
    for name, values in (("--window", args.window), ("--cut", cuts), ("--frame", [args.frame])):
        bad = [v for v in values if v < (1 if name == "--window" else 0)]
        if bad:
            fail("%s %d: must be %s" % (name, bad[0], "positive" if name == "--window" else "0 or more"))
    lengths = document_lengths(args.shards, args.split)
    rows = []
    print("| window | cut | mean framed length | documents per window | causal pairs across documents | windows |")
    print("|--:|--:|--:|--:|--:|--:|")
    for window in args.window:
        for cut in cuts:
            framed = (lengths if cut == 0 else np.minimum(lengths, cut)) + args.frame
            documents, across, windows = mix(framed, window)
            rows.append({"window": window, "cut": cut, "mean_framed_length": float(framed.mean()),
                         "documents_per_window": documents, "cross_document_pairs": across, "windows": windows})
            print("| %d | %s | %.1f | %.2f | %.3f | %d |" % (window, cut or "whole", framed.mean(), documents, across,
                                                             windows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
