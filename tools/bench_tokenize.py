#!/usr/bin/env python3
"""Tokenizer throughput, MB of text per CPU-second: `darkformer prepare` (one or more binaries, one
thread) against Python sentencepiece on the same C4 files and model, alternated, medians.

Python is timed twice per round: encoding alone, and reading the json.gz plus encoding (what
prepare's figure covers, less writing the shards). Each prepare writes to a fresh temporary
directory; its figure is the one it logs ("MB per CPU-second", the worker thread's CPU time).
Usage: tools/bench_tokenize.py --tokenizer gemma-256k.model --input 'c4/*.json.gz'
         [--darkformer build/darkformer ...] [--rounds 5]
"""
import argparse
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import tempfile
import time

import sentencepiece as spm

FIGURE = re.compile(r"([0-9.]+) MB per CPU-second")


def read_texts(paths):
    texts = []
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    return texts


def python_round(sp, paths):
    start = time.process_time()
    texts = read_texts(paths)
    read_s = time.process_time() - start
    start = time.process_time()
    tokens = sum(len(sp.encode(text)) for text in texts)  # one call per text: one thread, as prepare
    encode_s = time.process_time() - start
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    return mb / encode_s, mb / (read_s + encode_s), tokens


def prepare_round(binary, paths, tokenizer):
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as out:
        args = [binary, "prepare", "--tokenizer", tokenizer, "--output", out, "--threads", "1"]
        for path in paths:
            args += ["--input", path]
        run = subprocess.run(args, capture_output=True, text=True, check=True)
    found = FIGURE.findall(run.stdout + run.stderr)
    if not found:
        raise SystemExit(f"{binary}: no 'MB per CPU-second' in its log:\n{run.stderr[-2000:]}")
    return float(found[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--input", required=True, help="glob of C4 json.gz files")
    ap.add_argument("--darkformer", action="append", default=[], help="a darkformer binary (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    paths = sorted(glob.glob(args.input))
    if not paths:
        raise SystemExit(f"no files match {args.input}")
    sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
    print(f"{len(paths)} files, sentencepiece {spm.__version__} (Python), load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    figures = {name: [] for name in ["python encode", "python read+encode"] + args.darkformer}
    for r in range(args.rounds):
        encode, read_encode, tokens = python_round(sp, paths)
        figures["python encode"].append(encode)
        figures["python read+encode"].append(read_encode)
        for binary in args.darkformer:
            figures[binary].append(prepare_round(binary, paths, args.tokenizer))
        print(f"round {r + 1}: " + ", ".join(f"{name} {values[-1]:.2f}" for name, values in figures.items()))
    base = statistics.median(figures["python encode"])
    print(f"median MB per CPU-second over {args.rounds} rounds ({tokens} tokens per round):")
    for name, values in figures.items():
        median = statistics.median(values)
        print(f"  {name:<40} {median:6.2f}  ({median / base:.2f}x Python encode)")


if __name__ == "__main__":
    main()
