#!/usr/bin/env bash
# Builds data/demo/: a small C4-format corpus (gzip JSON lines with text, timestamp, url) made from
# the English prose of the Python 3.11 documentation that Debian's python3.11-doc package ships
# (PSF License), and an 8k-piece SentencePiece BPE model trained on it with spm_train (Debian's
# sentencepiece). No download. Idempotent: a second run with the same script returns at once.
# Prepared token shards come later, from the built binary: see docs/data.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/data/demo"
DOCS=/usr/share/doc/python3.11/html/_sources
VOCAB=8000
STAMP="$OUT/.stamp-$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
if [[ -f "$STAMP" && -f "$OUT/tokenizer.model" ]]; then exit 0; fi

log() { echo "[make_demo_corpus] $*"; }
for need in "$DOCS/tutorial/index.rst.txt" /usr/bin/spm_train; do
  if [[ ! -e "$need" ]]; then
    echo "[make_demo_corpus] error: $need is missing: install Debian's python3.11-doc and sentencepiece" \
         "(tools/setup.sh does)" >&2
    exit 1
  fi
done
rm -rf "$OUT"
mkdir -p "$OUT"

log "converting the reStructuredText sources in $DOCS to C4 JSON lines"
python3 - "$DOCS" "$OUT" <<'PY'
# One document per section of each page; prose paragraphs only, including those in the bodies of
# descriptive directives (function, class, note, ...): literal and code blocks, other directives,
# tables and doctests are dropped, inline markup is reduced to its text, and the lines of a
# paragraph are joined with spaces, paragraphs with newlines, as in C4.
import gzip, hashlib, io, json, os, re, sys

docs_root, out = sys.argv[1], sys.argv[2]
HEADING = re.compile(r"^([=\-~^*#+\"'`])\1{2,}\s*$")
DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::")
BULLET = re.compile(r"^([*+-]|#\.|\d+\.)\s+")
ROLE = re.compile(r":[\w:.+-]+:`!?~?([^`<]*?)\s*(?:<[^>]*>)?`")
LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`__?")
REF = re.compile(r"`([^`]+)`_+")
LITERAL = re.compile(r"``([^`]+)``")
EMPHASIS = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
# Directives whose indented body is prose; every other directive's body is skipped.
PROSE_DIRECTIVES = {
    "note", "warning", "important", "tip", "caution", "attention", "hint", "seealso", "admonition",
    "versionadded", "versionchanged", "deprecated", "deprecated-removed", "impl-detail", "topic",
    "function", "method", "class", "attribute", "data", "exception", "decorator", "decoratormethod",
    "classmethod", "staticmethod", "abstractmethod", "coroutinefunction", "coroutinemethod",
    "awaitablefunction", "module", "describe", "envvar", "option", "cmdoption", "opcode", "glossary",
    "c:function", "c:macro", "c:type", "c:member", "c:var", "c:struct"}
TIMESTAMP = "2023-02-08T00:00:00Z"  # python3.11-doc 3.11.2's release month; fixed for reproducibility

def clean(text):
    for pattern in (ROLE, LINK, REF, LITERAL, EMPHASIS):
        text = pattern.sub(r"\1", text)
    return text.replace("\\", "").strip()

def indent_of(line):
    return len(line) - len(line.lstrip(" "))

def sections(lines):
    """Yields (title, paragraphs) for each section of a page."""
    title, paragraphs, para = "", [], []
    para_indent = 0
    skip_deeper_than = None  # inside a skipped block: lines indented more than this

    def flush():
        if para:
            paragraphs.append(" ".join(para))
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\n").replace("\t", "    ")
        stripped = line.strip()
        indent = indent_of(line)
        i += 1
        if skip_deeper_than is not None:
            if not stripped or indent > skip_deeper_than:
                continue
            skip_deeper_than = None
        nxt = lines[i].rstrip("\n") if i < len(lines) else ""
        if stripped and indent == 0 and HEADING.match(nxt) and len(nxt.strip()) >= len(stripped):
            flush()
            if paragraphs:
                yield title, paragraphs
            title, paragraphs = clean(stripped), []
            i += 1
            continue
        if not stripped or HEADING.match(stripped):
            flush()
            continue
        directive = DIRECTIVE.match(stripped)
        if directive or stripped.startswith(".."):
            flush()
            if not directive or directive.group(1) not in PROSE_DIRECTIVES:
                skip_deeper_than = indent  # comments and non-prose directive bodies
            continue
        if stripped.startswith((":", ">>>", "|", "+-", "+=", "===")):
            flush()  # directive options, doctests, tables
            continue
        bullet = BULLET.match(stripped)
        if bullet or (para and indent != para_indent):
            flush()  # a list item, or a definition under its term, starts a paragraph
        if bullet:
            stripped = stripped[bullet.end():]
        if not para:
            para_indent = indent
        if stripped.endswith("::"):
            # "text::" introduces a literal block: keep "text:", skip the block.
            stripped = stripped[:-2].rstrip()
            if stripped:
                para.append(stripped + ":")
            flush()
            skip_deeper_than = indent
            continue
        para.append(stripped)
    flush()
    if paragraphs:
        yield title, paragraphs

files = []
for dirpath, _, names in os.walk(docs_root):
    for name in names:
        if name.endswith(".rst.txt"):
            files.append(os.path.join(dirpath, name))
files.sort()

records = []
for path in files:
    rel = os.path.relpath(path, docs_root)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for n, (title, paragraphs) in enumerate(sections(lines)):
        paragraphs = [clean(p) for p in paragraphs]
        paragraphs = [p for p in paragraphs if len(p) >= 40 and p[-1] in ".:!?)\"'"]
        text = "\n".join(([title] if title else []) + paragraphs)
        if sum(len(p) for p in paragraphs) < 200:
            continue
        url = "https://docs.python.org/3.11/" + rel[: -len(".rst.txt")] + ".html#section-" + str(n)
        records.append({"text": text, "timestamp": TIMESTAMP, "url": url})

# About 2% of the documents, chosen by a hash of their url, form the validation file.
def is_val(record):
    return hashlib.sha256(record["url"].encode()).digest()[0] < 6

train = [r for r in records if not is_val(r)]
val = [r for r in records if is_val(r)]
num_shards = 4

def write(name, rows):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:
        for r in rows:
            gz.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))
    with open(os.path.join(out, name), "wb") as f:
        f.write(buf.getvalue())

for s in range(num_shards):
    write(f"c4-demo-train.{s:05d}-of-{num_shards:05d}.json.gz", train[s::num_shards])
write("c4-demo-validation.00000-of-00001.json.gz", val)
# spm_train reads one sentence per line: one paragraph per line of the training documents.
with open(os.path.join(out, "spm_train_input.txt"), "w", encoding="utf-8") as f:
    for r in train:
        f.write(r["text"] + "\n")
chars = sum(len(r["text"].encode("utf-8")) for r in records)
print(f"[make_demo_corpus] {len(train)} train + {len(val)} validation documents, {chars / 1e6:.1f} MB of text")
PY

log "training a $VOCAB-piece SentencePiece BPE model (Gemma's special ids: pad 0, eos 1, bos 2, unk 3)"
spm_train --input="$OUT/spm_train_input.txt" --model_prefix="$OUT/tokenizer" --vocab_size=$VOCAB \
  --model_type=bpe --character_coverage=0.9995 --byte_fallback=true --split_digits=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false --max_sentence_length=65536 \
  --pad_id=0 --eos_id=1 --bos_id=2 --unk_id=3 --bos_piece="<bos>" --eos_piece="<eos>" --num_threads=2 --minloglevel=1 > "$OUT/spm_train.log" 2>&1 ||
  { cat "$OUT/spm_train.log" >&2; exit 1; }
rm -f "$OUT/spm_train_input.txt"
touch "$STAMP"
log "done: $(ls "$OUT" | tr '\n' ' ')"
