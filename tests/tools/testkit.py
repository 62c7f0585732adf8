"""Shared helpers for Python tests that drive the `darkformer` binary: where the binary is, tiny
token shards (a tiny SentencePiece model + `darkformer prepare`), a minimal run config and a
subprocess runner. Not a test itself (ctest only picks up tests/tools/test_*.py)."""

import copy
import gzip
import json
import os
import random
import subprocess

import yaml

SOURCE_DIR = os.environ.get("DARKFORMER_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BINARY = os.path.join(os.environ.get("DARKFORMER_BINARY_DIR") or os.path.join(SOURCE_DIR, "build"),
                      "darkformer")

# Words of the generated corpus: enough distinct ones that BPE reaches a few hundred pieces.
_WORDS = ("the data model learns from text and every token counts a small corpus of words makes tests "
          "fast attention is random feature kernel with packing quick brown fox jumps over lazy dog "
          "river mountain window garden yellow purple orange silver golden winter summer autumn spring "
          "morning evening library village harbor engine bridge castle forest meadow island candle "
          "letter number question answer teacher student kitchen market journey thunder whisper "
          "shadow crystal marble velvet copper ribbon lantern compass anchor feather pepper").split()
_PHRASES = (
    "The model learns from text and every token counts.",
    "A small corpus of words makes tests fast.",
    "Attention is a random feature kernel with packing.",
    "The quick brown fox jumps over the lazy dog.",
)
_cache = {}


def _sentence(rng):
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 10))]
    return " ".join(words).capitalize() + "."


def corpus_documents(count, seed=7):
    """Deterministic English-like documents: a fixed phrase plus a few generated sentences."""
    rng = random.Random(seed)
    return [" ".join([_PHRASES[d % len(_PHRASES)]] + [_sentence(rng) for _ in range(rng.randint(2, 5))])
            for d in range(count)]


def write_c4(path, texts):
    """Writes C4-style JSON lines (gzip when the name ends in .gz)."""
    lines = "".join(json.dumps({"text": t, "timestamp": "2019-04-20T12:00:00Z",
                                "url": "https://example.com/%d" % i}) + "\n" for i, t in enumerate(texts))
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(lines)


def train_tokenizer(prefix, vocab_size):
    """Trains a tiny BPE SentencePiece model at prefix.model (ids: pad 0, eos 1, bos 2, unk 3)."""
    import sentencepiece as spm
    corpus = prefix + "-corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(corpus_documents(400, seed=11)) + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="bpe", character_coverage=1.0,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, normalization_rule_name="identity",
        remove_extra_whitespaces=False, minloglevel=2)
    return prefix + ".model"


def tiny_shards(workdir, vocab_size=200, documents=200):
    """Token shards of a generated corpus: {"shards_dir", "tokenizer", "vocab_size"}; cached per
    (workdir, vocab_size), in memory and on disk (a finished prepare leaves manifest.yaml)."""
    key = (os.path.abspath(workdir), vocab_size)
    if key in _cache:
        return dict(_cache[key])
    base = os.path.join(key[0], "tiny-%d" % vocab_size)
    os.makedirs(base, exist_ok=True)
    model = os.path.join(base, "tokenizer.model")
    if not os.path.exists(model):
        train_tokenizer(os.path.join(base, "tokenizer"), vocab_size)
    shards_dir = os.path.join(base, "shards")
    if not os.path.exists(os.path.join(shards_dir, "manifest.yaml")):
        source = os.path.join(base, "c4-train.00000-of-00001.json.gz")
        write_c4(source, corpus_documents(documents))
        run(["prepare", "-i", source, "-t", model, "-o", shards_dir, "--val-fraction", "0.1", "-j", "1"],
            check=True)
    import sentencepiece as spm
    size = spm.SentencePieceProcessor(model_file=model).get_piece_size()
    _cache[key] = {"shards_dir": shards_dir, "tokenizer": model, "vocab_size": size}
    return dict(_cache[key])


def deep_merge(base, overlay):
    """base with overlay merged in (maps recursively, everything else replaced); base untouched."""
    out = copy.deepcopy(base)
    for k, v in overlay.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def run_config(run_dir, shards, kernel="exact", model=None, **sections):
    """A minimal valid run config (a tiny Gemma, a few CPU steps) with `sections` merged on top."""
    if model is None:
        model = {"family": "gemma", "vocab_size": shards.get("vocab_size", 200), "hidden_size": 32,
                 "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "head_dim": 16, "max_position_embeddings": 64}
    config = {
        "model": model,
        "attention": {"kernel": kernel},
        "data": {"shards_dir": shards["shards_dir"], "tokenizer": shards["tokenizer"], "seq_len": 32,
                 "batch_size": 4},
        "train": {"steps": 4, "device": "cpu", "threads": 1, "checkpoint_every": 2, "warmup_steps": 1},
        "eval": {"every": 0, "batches": 1},
        "log": {"dir": run_dir},
    }
    return deep_merge(config, sections)


def write_yaml(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(obj, f, sort_keys=False)


def run(args, timeout=180, check=False):
    """Runs the binary with `args`; stdout and stderr captured separately, as text."""
    result = subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError("darkformer %s exited %d:\n%s" % (" ".join(map(str, args)), result.returncode,
                                                              result.stderr[-4000:]))
    return result


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def checker(failures):
    """check(ok, what) for a whole-file check script: prints each check as `ok` or `FAIL` and keeps
    each failure in `failures`, for report()."""
    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)
    return check


def report(failures):
    """The exit status of a whole-file check script: 0 when no check failed, with a last line saying so."""
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


def run_case_main(argv, cases, failures, tmp_prefix):
    """The `main` of a case-per-invocation test script (one ctest per case): `SCRIPT CASE` runs
    one case in a fresh temporary directory (kept with DARKFORMER_KEEP_TMP) and returns 0 when it
    recorded no failure; `SCRIPT --list` prints the case names."""
    import shutil
    import sys
    import tempfile
    import traceback
    script = os.path.basename(argv[0])
    if len(argv) == 2 and argv[1] == "--list":
        print("\n".join(cases))
        return 0
    if len(argv) != 2 or argv[1] not in cases:
        print("usage: %s CASE | --list\ncases: %s" % (script, " ".join(cases)), file=sys.stderr)
        return 1
    if not os.access(BINARY, os.X_OK):
        print("FAIL the binary %s is missing" % BINARY)
        return 1
    tmp = tempfile.mkdtemp(prefix="%s-%s-" % (tmp_prefix, argv[1]))
    try:
        cases[argv[1]](tmp)
    except Exception:  # a broken expectation (missing file, unparsable output) is a failure
        traceback.print_exc()
        failures.append("exception")
    finally:
        if os.environ.get("DARKFORMER_KEEP_TMP"):
            print("kept " + tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("%s: %s" % (argv[1], "FAIL (%d)" % len(failures) if failures else "pass"))
    return 1 if failures else 0
