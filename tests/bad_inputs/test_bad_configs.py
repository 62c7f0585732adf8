"""Bad inputs, round three: configs that contradict themselves. Same contract as
test_bad_inputs.py (badkit.py): exit 2, one error line naming the culprit, nothing on stdout.

    python test_bad_configs.py CASE | --list
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import testkit as tk  # noqa: E402
from badkit import CASES, case, check, expect_bad, expect_ok, failures, setup_run, train, train_steps  # noqa: E402

MQAR = {"source": "mqar", "seq_len": 32, "batch_size": 4,
        "mqar": {"vocab_size": 64, "num_kv_pairs": 4, "train_examples": 64, "val_examples": 8}}


@case
def seq_len_beyond_positions(tmp):
    path, run_dir, _ = setup_run(tmp)  # the tiny model has 64 positions
    expect_bad(train(path, "data.seq_len=128"), "data.seq_len", "model.max_position_embeddings", run_dir=run_dir,
               what="data.seq_len 128 > max_position_embeddings 64")
    expect_ok(train(path, "data.seq_len=64", "train.steps=1"), "data.seq_len equal to the positions")


@case
def mqar_keys_as_written(tmp):
    path, run_dir, config = setup_run(tmp)
    mqar = dict(config, data=MQAR, model=dict(config["model"], vocab_size=64))
    tk.write_yaml(path, mqar)
    res = train(path, "data.seq_len=31")
    expect_bad(res, "data.seq_len", run_dir=run_dir, what="MQAR with an odd data.seq_len")
    check("data.mqar.seq_len" not in res.stderr, "the error names data.seq_len, the key the user wrote")
    expect_bad(train(path, "data.mqar.num_kv_pairs=9"), "data.mqar.num_kv_pairs", "data.seq_len", run_dir=run_dir,
               what="9 pairs do not fit 32 tokens")
    # A C4 config switched to MQAR keeps its shards_dir and tokenizer, unread (docs/data.md).
    c4_path, c4_dir, c4 = setup_run(tmp, name="c4")
    tk.write_yaml(c4_path, dict(c4, model=dict(c4["model"], vocab_size=64)))
    res = train(c4_path, "data.source=mqar", "data.mqar.vocab_size=64", "data.mqar.num_kv_pairs=4",
                "data.mqar.train_examples=64", "data.mqar.val_examples=8", "train.steps=2")
    expect_ok(res, "--set data.source=mqar on a C4 config")
    check(train_steps(c4_dir) == [1, 2], "it trained steps 1..2")
    check(any("data.shards_dir" in l and "not read" in l for l in res.stderr.splitlines()),
          "a note says data.shards_dir is not read")


@case
def document_masking_without_boundaries(tmp):
    path, run_dir, _ = setup_run(tmp)
    expect_bad(train(path, "data.document_positions=restart"), "data.document_positions", "data.document_masking",
               run_dir=run_dir, what="positions that restart per document without document masking")
    expect_bad(train(path, "data.document_masking=true", "data.document_positions=sideways"),
               "data.document_positions", run_dir=run_dir, what="an unknown data.document_positions")
    expect_ok(train(path, "data.document_masking=true", "data.document_positions=restart", "train.steps=2"),
              "document masking on C4 shards (EOS recorded)")
    # Labelled records prepared without --eos-id: no boundary can be found, so masking is refused.
    source = os.path.join(tmp, "bench.jsonl")
    with open(source, "w") as f:
        f.write('{"input_ids": [5, 6, 7], "labels": [6, 7, -100]}\n' * 8)
    labelled = os.path.join(tmp, "labelled")
    tk.run(["prepare", "--labelled", "--vocab-size", "50", "--val-input", source, "-o", labelled, "-j", "1"], check=True)
    res = tk.run(["eval", "--config", path, "--checkpoint", run_dir, "--set", "data.shards_dir=" + labelled,
                  "--set", "data.tokenizer=", "--set", "data.document_masking=true"])
    expect_bad(res, "data.document_masking", "EOS", what="document masking on labelled records without an EOS id")


@case
def cuda_op_on_a_cpu_run(tmp):
    # op: cuda (the CUDA operator) runs on a CUDA device only: a CPU run is refused at load.
    path, run_dir, _ = setup_run(tmp)
    expect_bad(train(path, "attention.performer.op=cuda", "train.device=cpu"), "attention.performer.op",
               "CUDA device", run_dir=run_dir, what="op: cuda on a CPU run")
    # sub_chunk is op: cuda's: another form would not read it, so it is refused, naming both keys.
    expect_bad(train(path, "attention.performer.sub_chunk=32"), "attention.performer.sub_chunk",
               "attention.performer.op", run_dir=run_dir, what="sub_chunk without op: cuda")
    expect_bad(train(path, "attention.performer.op=cuda", "attention.performer.sub_chunk=-1"),
               "attention.performer.sub_chunk", run_dir=run_dir, what="a negative sub_chunk")
    # So is segment_chunks, op: cuda's too.
    expect_bad(train(path, "attention.performer.segment_chunks=4"), "attention.performer.segment_chunks",
               "attention.performer.op", run_dir=run_dir, what="segment_chunks without op: cuda")
    expect_bad(train(path, "attention.performer.op=cuda", "attention.performer.segment_chunks=-1"),
               "attention.performer.segment_chunks", run_dir=run_dir, what="a negative segment_chunks")
    # And pairs: exponentials, op: cuda's arithmetic; a value outside its two is refused anywhere.
    expect_bad(train(path, "attention.performer.pairs=exponentials"), "attention.performer.pairs",
               "attention.performer.op", run_dir=run_dir, what="pairs: exponentials without op: cuda")
    expect_bad(train(path, "attention.performer.op=cuda", "attention.performer.pairs=sometimes"),
               "attention.performer.pairs", run_dir=run_dir, what="an unknown pairs")
    # And precompute_features, where another form would not read it; a value not a bool anywhere.
    expect_bad(train(path, "attention.performer.precompute_features=true"), "attention.performer.precompute_features",
               "attention.performer.op", run_dir=run_dir, what="precompute_features without op: cuda")
    expect_bad(train(path, "attention.performer.op=cuda", "attention.performer.precompute_features=often"),
               "attention.performer.precompute_features", run_dir=run_dir, what="a precompute_features not a bool")


def main(argv):
    return tk.run_case_main(argv, CASES, failures, "df-bad-configs")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
