"""tools/document_mix.py on shards whose mix is known by hand:
1. documents of 2 tokens framed to 4, windows of 8: each window holds 2 whole documents, and of its
   8 * 9 / 2 = 36 causal pairs 2 * (4 * 5 / 2) = 20 lie inside one, so 16 / 36 cross;
2. documents of 10 tokens cut to 2 give the same rows as documents of 2; uncut, framed to 12,
   windows of 8 hold parts of 1, 2, 1, ... documents;
3. bad input exits 2 naming it: a missing folder, a file that is not a documents file, a window
   longer than the stream, a negative cut."""

import json
import os
import subprocess
import sys
import tempfile

import testkit

TOOL = os.path.join(testkit.SOURCE_DIR, "tools", "document_mix.py")


def write_docs(folder, lengths, name="shard-00000.train.docs", magic=b"DFDOCv1\0"):
    os.makedirs(folder, exist_ok=True)
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(magic + len(lengths).to_bytes(8, "little"))
        for o in offsets:
            f.write(o.to_bytes(8, "little"))


def run(*args):
    return subprocess.run([sys.executable, TOOL] + list(args), capture_output=True, text=True, timeout=60)


def rows(work, shards, *args):
    out = os.path.join(work, "rows.json")
    result = run("--shards", shards, "--json", out, *args)
    return result, (json.load(open(out)) if result.returncode == 0 else [])


def main():
    failures = []
    with tempfile.TemporaryDirectory(prefix="document-mix-") as work:
        short, long_ = os.path.join(work, "short"), os.path.join(work, "long")
        write_docs(short, [2] * 8)
        write_docs(os.path.join(short, "second"), [2])  # another folder: not read
        write_docs(long_, [10] * 8)

        result, got = rows(work, short, "--window", "8")
        want = {"window": 8, "cut": 0, "mean_framed_length": 4.0, "documents_per_window": 2.0, "windows": 4}
        if result.returncode != 0 or len(got) != 1 or any(got[0][k] != v for k, v in want.items()) or \
                abs(got[0]["cross_document_pairs"] - 16 / 36) > 1e-12:
            failures.append("two documents a window: exit %d, %r, %r" % (result.returncode, got, result.stderr))

        result, cut = rows(work, long_, "--window", "8", "--cut", "2", "--cut", "0")
        if result.returncode != 0 or len(cut) != 2 or \
                {k: v for k, v in cut[0].items() if k != "cut"} != {k: v for k, v in got[0].items() if k != "cut"}:
            failures.append("cut to 2: exit %d, %r" % (result.returncode, cut))
        # uncut: framed length 12; windows [0,8) one document, [8,16) two (4 + 4), [16,24) one, and so
        # on: 4 documents per 3 windows, and one window in 3 with 16 of 36 pairs across
        elif abs(cut[1]["documents_per_window"] - 4 / 3) > 1e-12 or abs(cut[1]["cross_document_pairs"] - 16 / 108) > 1e-12:
            failures.append("uncut documents of 12 in windows of 8: %r" % cut[1])

        write_docs(os.path.join(work, "bad"), [2, 2], magic=b"NOTDOCS\0")
        for args, says in ((["--shards", os.path.join(work, "nowhere"), "--window", "8"], "nowhere"),
                           (["--shards", os.path.join(work, "bad"), "--window", "8"], "shard-00000.train.docs"),
                           (["--shards", short, "--window", "64"], "--window 64"),
                           (["--shards", short, "--window", "8", "--cut", "-1"], "--cut -1"),
                           (["--shards", short, "--split", "val", "--window", "8"], "val.docs")):
            result = run(*args)
            if result.returncode != 2 or says not in result.stderr:
                failures.append("%r: exit %d, %r" % (args, result.returncode, result.stderr))
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
