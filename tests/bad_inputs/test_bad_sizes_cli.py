"""Bad inputs, round three: sizes that cannot fit, command-line parse errors, generation's numeric
edges, eval's batch count, an empty log.dir and sweep --parallel. Same contract as
test_bad_inputs.py (badkit.py): exit 2, one error line naming the culprit, nothing on stdout.

    python test_bad_sizes_cli.py CASE | --list
"""

import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import testkit as tk  # noqa: E402
from badkit import CASES, case, check, expect_bad, expect_ok, failures, setup_run, train  # noqa: E402

# A size check that failed would make LibTorch try to allocate terabytes: cap the address space so
# such a failure is a quick error here, never a machine driven into swap.
ADDRESS_SPACE_LIMIT = 6 << 30


def run_capped(args, timeout=120):
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))
    return subprocess.run([tk.BINARY, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=cap)


@case
def sizes_that_cannot_fit(tmp):
    path, run_dir, _ = setup_run(tmp)
    too_large = [("model.hidden_size", 10 ** 9), ("model.hidden_size", 2 ** 63 - 1), ("model.vocab_size", 10 ** 12),
                 ("model.num_hidden_layers", 10 ** 6), ("model.num_attention_heads", 10 ** 6),
                 ("model.head_dim", 10 ** 8), ("data.seq_len", 10 ** 9)]
    for key, value in too_large:
        # A length beyond the model's positions is refused first (test_bad_configs.py): raise them too.
        positions = ["--set", "model.max_position_embeddings=%d" % value] if key == "data.seq_len" else []
        res = run_capped(["train", "--config", path, "--set", "%s=%d" % (key, value), *positions])
        expect_bad(res, key, str(value), "too large", run_dir=run_dir, what="%s = %d" % (key, value))
        check(not os.path.exists(run_dir), "%s = %d: the run directory is not created" % (key, value))
    res = run_capped(["train", "--config", path, "--set", "model.intermediate_size=" + "2" + "0" * 40])
    expect_bad(res, "model.intermediate_size", run_dir=run_dir, what="intermediate_size 2e40")
    for kernel in ("performer", "darkformer"):
        res = run_capped(["train", "--config", path, "--set", "attention.kernel=" + kernel,
                          "--set", "attention.%s.num_features=1000000000" % kernel])
        expect_bad(res, "attention.%s.num_features" % kernel, "too large", run_dir=run_dir,
                   what="%s num_features 1e9" % kernel)
    # kernel-check builds its kernels from --options: the same size checks name num_features there,
    # for the projection (1e9) and for one feature map at the bench's longest length (1e7).
    for features, needle in ((10 ** 9, "projection"), (10 ** 7, "feature map")):
        res = run_capped(["kernel-check", "--bench", "--kernel", "darkformer", "--bench-lengths", "2048",
                          "--options", "{num_features: %d}" % features])
        expect_bad(res, "attention.darkformer.num_features", needle, what="kernel-check num_features %d" % features)
    # The same checks guard the forward-only commands.
    res = run_capped(["eval", "--config", path, "--set", "model.hidden_size=1000000000"])
    expect_bad(res, "model.hidden_size", "too large", what="eval with hidden_size 1e9")
    res = run_capped(["generate", "--config", path, "--prompt", "the", "--set", "model.vocab_size=1000000000000"])
    expect_bad(res, "model.vocab_size", "too large", what="generate with vocab_size 1e12")
    # A run that fits still starts (the estimate is not a false alarm for the tiny model).
    expect_ok(run_capped(["train", "--config", path, "--set", "train.steps=1"]), "the tiny run itself")


@case
def command_line_errors(tmp):
    path, _, _ = setup_run(tmp)
    missing_json = os.path.join(tmp, "no_such_dir", "rows.jsonl")
    json_refused = "--json: cannot write '%s'" % missing_json
    for args, needle in ((["train", "--config", path, "--bogus"], "--bogus"),
                         (["train", "--config"], "--config"),
                         (["eval", "--config", path, "--batches"], "--batches"),
                         (["generate", "--config", path, "--prompt", "the", "--max-new-tokens", "abc"],
                          "--max-new-tokens"),
                         (["sweep", "--config", path, "--parallel", "0"], "--parallel"),
                         (["sweep", "--config", path, "--parallel", "-1"], "--parallel"),
                         (["kernel-check", "--kernel", "performer", "--options", "{num_features: ["], "--options"),
                         (["kernel-check", "--kernel", "performer", "--options", "just text"], "--options"),
                         (["kernel-check", "--kernel", "performer", "--options", "[1, 2]"], "--options"),
                         # --op takes every form of the operator (ops/feature_map.h's one list), and the
                         # CUDA operator is refused on a CPU, naming itself.
                         (["kernel-check", "--bench", "--kernel", "performer", "--op", "bogus"], "--op"),
                         (["kernel-check", "--bench", "--kernel", "performer", "--device", "cpu", "--op", "auto,cuda",
                           "--heads", "2", "--kv-heads", "1", "--bench-head-dims", "8", "--bench-lengths", "16",
                           "--options", "{num_features: 16}", "--repeats", "1"], "--op cuda"),
                         # TF32 as train.tf32: the CPU has none, so true there is refused, naming the flag.
                         (["kernel-check", "--bench", "--kernel", "performer", "--device", "cpu", "--tf32", "true",
                           "--heads", "2", "--kv-heads", "1", "--bench-head-dims", "8", "--bench-lengths", "16",
                           "--options", "{num_features: 16}", "--repeats", "1"], "--tf32 true"),
                         (["kernel-check", "--bench", "--kernel", "performer", "--tf32", "maybe"], "--tf32"),
                         # op: cuda's sub_chunk beside a form that would not read it: refused, naming both.
                         (["kernel-check", "--bench", "--kernel", "performer", "--device", "cpu", "--op", "auto",
                           "--heads", "2", "--kv-heads", "1", "--bench-head-dims", "8", "--bench-lengths", "16",
                           "--options", "{num_features: 16, sub_chunk: 16}", "--repeats", "1"], ("sub_chunk", "--op auto")),
                         (["kernel-check", "--bench", "--kernel", "darkformer", "--device", "cpu", "--op", "auto",
                           "--heads", "2", "--kv-heads", "1", "--bench-head-dims", "8", "--bench-lengths", "16",
                           "--options", "{num_features: 16, segment_chunks: 4}", "--repeats", "1"],
                          ("segment_chunks", "--op auto")),
                         (["kernel-check", "--bench", "--kernel", "performer", "--device", "cpu", "--op", "auto",
                           "--heads", "2", "--kv-heads", "1", "--bench-head-dims", "8", "--bench-lengths", "16",
                           "--options", "{num_features: 16, pairs: exponentials}", "--repeats", "1"],
                          ("pairs", "--op auto")),
                         # The bench's options do nothing without --bench: refused, naming both.
                         (["kernel-check", "--kernel", "performer", "--op", "cuda"], "--op requires --bench"),
                         (["kernel-check", "--kernel", "performer", "--bench-norm", "60"], "--bench-norm requires --bench"),
                         # --json is opened before anything is timed or printed: a path that cannot be
                         # written costs no bench, and names the flag and the path.
                         (["kernel-check", "--bench", "--kernel", "performer", "--device", "cpu", "--op", "auto",
                           "--heads", "2", "--kv-heads", "1", "--bench-head-dims", "8", "--bench-lengths", "16",
                           "--options", "{num_features: 16}", "--repeats", "1", "--json", missing_json],
                          json_refused),
                         (["kernel-check", "--estimators", "--features", "4", "--draws", "2", "--json", missing_json],
                          json_refused),
                         (["decode-bench", "--config", path, "--contexts", "8", "--json", missing_json],
                          json_refused),
                         (["bogus"], ("unknown command 'bogus'",)),
                         (["trian", "--config", path], "'trian'"),
                         (["train", "--bogus"], "--bogus"),
                         (["--bogus"], "--bogus")):
        expect_bad(tk.run(args), needle, what=" ".join(args[:1] + args[2:]))
    for sub in ("train", "eval", "generate", "prepare", "sweep", "kernel-check", "inspect"):
        res = tk.run([sub, "--help"])
        check(res.returncode == 0 and "--" in res.stdout, "%s --help exits 0 with its text" % sub)


@case
def generation_edges(tmp):
    path, run_dir, _ = setup_run(tmp, train={"steps": 2})
    if not expect_ok(train(path), "2-step run"):
        return
    greedy = tk.run(["generate", "--config", path, "--prompt", "the", "--max-new-tokens", "8", "--greedy"])
    expect_ok(greedy, "greedy generation")
    for temperature in ("1e-30", "1e-45", "4.9e-324"):
        res = tk.run(["generate", "--config", path, "--prompt", "the", "--max-new-tokens", "8",
                      "--temperature", temperature, "--seed", "3"])
        expect_ok(res, "--temperature " + temperature)
        check(res.stdout == greedy.stdout, "--temperature %s gives greedy's text" % temperature,
              "%r vs %r" % (res.stdout[:80], greedy.stdout[:80]))
    for temperature in ("0", "-1", "nan", "inf"):
        expect_bad(tk.run(["generate", "--config", path, "--prompt", "the", "--temperature", temperature]),
                   "--temperature", what="--temperature " + temperature)
    big = tk.run(["generate", "--config", path, "--prompt", "the", "--max-new-tokens", str(2 ** 63 - 1), "--greedy"])
    expect_ok(big, "--max-new-tokens near int64's maximum")
    check(not any(c in big.stderr for c in ("-9223", "overflow")), "no negative count in the messages",
          big.stderr[-300:])
    check(any("--max-new-tokens" in l for l in big.stderr.splitlines()), "the warning names --max-new-tokens")
    lf, crlf = os.path.join(tmp, "lf.txt"), os.path.join(tmp, "crlf.txt")
    open(lf, "wb").write(b"the\nthe data\n")
    open(crlf, "wb").write(b"the\r\nthe data\r\n")
    outs = [tk.run(["generate", "--config", path, "--prompt-file", f, "--max-new-tokens", "4", "--greedy"])
            for f in (lf, crlf)]
    check(all(o.returncode == 0 for o in outs) and outs[0].stdout == outs[1].stdout and "\r" not in outs[1].stdout,
          "a CRLF prompt file gives the same prompts as LF", repr(outs[1].stdout[:120]))
    expect_bad(tk.run(["generate", "--config", path, "--prompt-file", os.path.join(tmp, "none.txt")]),
               "--prompt-file", what="missing prompt file")


@case
def eval_batches_capped(tmp):
    path, _, _ = setup_run(tmp, train={"steps": 2})
    if not expect_ok(train(path), "2-step run"):
        return
    one = tk.run(["eval", "--config", path, "--batches", "1000000"], timeout=60)
    huge = tk.run(["eval", "--config", path, "--batches", "1000000000000"], timeout=60)
    for res, what in ((one, "10^6"), (huge, "10^12")):
        expect_ok(res, "eval --batches " + what + " ends (one pass)")
    check(one.stdout and json.loads(one.stdout)["tokens"] == json.loads(huge.stdout)["tokens"],
          "both evaluate the split once (same token count)")
    expect_bad(tk.run(["eval", "--config", path, "--batches", "-3"]), "--batches", what="--batches -3")


@case
def empty_log_dir(tmp):
    path, _, _ = setup_run(tmp)
    for value in ("", "'  '"):
        res = train(path, "log.dir=" + value)
        expect_bad(res, "log.dir", what="log.dir=%r" % value)
    check(not os.path.exists(os.path.join(os.getcwd(), "runs", "run", "summary.json")), "nothing under runs/run")


@case
def messages_name_their_source(tmp):
    """A misspelt key suggests the declared one; a --set key is named as coming from --set (not line 1
    of a file that does not hold it); eval without a checkpoint names log.dir, the key it read."""
    path, run_dir, _ = setup_run(tmp)
    res = train(path, "train.lrr=1")
    expect_bad(res, "unknown config key 'train.lrr'", "(from --set train.lrr=1)", "did you mean 'train.lr'?",
               what="--set train.lrr=1")
    check("(line" not in error_line(res), "--set train.lrr=1: no file line is named")
    res = train(path, "train.spikes={windw: 3}")
    expect_bad(res, "train.spikes.windw", "(from --set train.spikes={windw: 3})", "did you mean 'train.spikes.window'?",
               what="--set train.spikes={windw: 3}")
    res = train(path, "attention.kernel=perfomer")
    expect_bad(res, "attention.kernel", "did you mean 'performer'?", what="kernel perfomer")
    res = train(path, "train.precision=bf16")
    expect_bad(res, "train.precision", "(from --set train.precision=bf16)", "did you mean 'bf16_autocast'?",
               what="precision bf16")
    # The same key in the file: its line.
    with open(path) as f:
        lines = f.read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("train:"))
    lines.insert(at + 1, "  lrr: 1")
    bad_path = os.path.join(tmp, "bad.yaml")
    with open(bad_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    expect_bad(train(bad_path), "train.lrr", "(line %d)" % (at + 2), "did you mean 'train.lr'?", what="lrr in the file")
    # Merged configs copy nodes without their lines: a key a `base:` file gave is named by that
    # file and its line, and a key of the file named on the command line by its own line, a --set
    # beside it or not.
    top_path = os.path.join(tmp, "top.yaml")
    with open(top_path, "w") as f:
        f.write("# the run's config with one misspelt key, on its base\nbase: bad.yaml\n")
    expect_bad(train(top_path), "train.lrr", "(line %d of %s)" % (at + 2, bad_path), what="lrr in a base file")
    with open(top_path, "w") as f:
        f.write("# the run's config with one misspelt key, on its base\nbase: %s\ntrain:\n  lrr: 1\n"
                % os.path.basename(path))
    expect_bad(train(top_path, "train.steps=2"), "train.lrr", "(line 4)", what="lrr in a file on a base, with a --set")
    res = tk.run(["eval", "--config", path])
    expect_bad(res, "log.dir", what="eval with no checkpoint in log.dir")
    check("init_from" not in error_line(res), "eval: the error does not name train.init_from")
    res = tk.run(["eval", "--config", path, "--checkpoint", os.path.join(tmp, "missing.h5")])
    expect_bad(res, "--checkpoint", "missing.h5", what="eval --checkpoint missing.h5")


def error_line(res):
    return next((line for line in res.stderr.splitlines() if "[error]" in line), "")


def main(argv):
    return tk.run_case_main(argv, CASES, failures, "df-bad-sizes")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
