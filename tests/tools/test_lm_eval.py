"""lm-evaluation-harness end to end, offline, on a model this binary trained and tools/convert_hf_gemma.py
exported: a tiny local multiple-choice task (JSONL written here), `--model hf` with the darkformer
plug-in (`import darkformer_hf`, attn_implementation="darkformer") for a DARKFormer model and sdpa
for an exact one. Each choice's log-likelihood that lm-eval reports equals the one computed here
directly with transformers (same model, same attention), its accuracy is their argmax's, and for
DARKFormer those log-likelihoods are not softmax attention's. For DARKFormer, --batch_size 4 gives
the same log-likelihoods and, on a generate_until task (left-padded prompts), --batch_size 1's
generations."""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import testkit

os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
CONVERT = os.path.join(testkit.SOURCE_DIR, "tools", "convert_hf_gemma.py")
failures = []
check = testkit.checker(failures)


def export(work, shards, kernel, options):
    run_dir = os.path.join(work, "run-" + kernel)
    attention = {"kernel": kernel}
    if options:
        attention[kernel] = options
    config = testkit.run_config(run_dir, shards, kernel=kernel, attention=attention,
                                train={"steps": 4, "checkpoint_every": 4})
    path = os.path.join(work, kernel + ".yaml")
    testkit.write_yaml(path, config)
    testkit.run(["train", "--config", path], check=True)
    h5 = os.path.join(run_dir, "checkpoints", "step_00000004.h5")
    out = os.path.join(work, "hf-" + kernel)
    subprocess.run([sys.executable, CONVERT, "to-hf", h5, out], check=True, capture_output=True, text=True)
    shutil.copy(shards["tokenizer"], os.path.join(out, "tokenizer.model"))  # Gemma's tokenizer, from the SentencePiece model
    return out


def write_task(task_dir):
    rng = random.Random(5)
    rows = []
    for d in testkit.corpus_documents(24, seed=3):
        words = d.split()
        right = words[6]
        choices = [right] + [rng.choice(testkit._WORDS) for _ in range(2)]
        rng.shuffle(choices)
        rows.append({"context": " ".join(words[:6]), "choices": choices, "gold": choices.index(right)})
    data = os.path.join(task_dir, "tiny_mc.jsonl")
    with open(data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(task_dir, "tiny_mc.yaml"), "w") as f:
        f.write("task: tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: %s\ntest_split: test\n"
                "output_type: multiple_choice\ndoc_to_text: \"{{context}}\"\ndoc_to_choice: \"{{choices}}\"\n"
                "doc_to_target: \"{{gold}}\"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
                "    higher_is_better: true\n" % data)
    return len(rows)


def direct_loglikelihoods(model_dir, attention, requests):
    """sum log p(continuation | context) per (context, continuation), as lm-eval's hf model splits them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attention).eval()
    out = []
    for context, continuation in requests:
        whole = tok(context + continuation, add_special_tokens=False).input_ids
        ctx = tok(context, add_special_tokens=False).input_ids
        cont = whole[len(ctx):]
        with torch.no_grad():
            logp = model(torch.tensor([whole])).logits.log_softmax(-1)[0]
        out.append(sum(logp[len(whole) - len(cont) - 1 + i, t].item() for i, t in enumerate(cont)))
    return out


def evaluate(model_dir, attention, task_dir, docs, kernel):
    import lm_eval
    from lm_eval.tasks import TaskManager
    # Our task alone: indexing lm-eval's thousands of built-in task files takes half a minute a time
    # (the command line below still does, as a user's run would).
    tasks = TaskManager(include_path=task_dir, include_defaults=False)
    res = lm_eval.simple_evaluate(model="hf", model_args="pretrained=%s,dtype=float32,attn_implementation=%s" % (
        model_dir, attention), tasks=["tiny_mc"], task_manager=tasks, device="cpu", batch_size=1, log_samples=True)
    samples = sorted(res["samples"]["tiny_mc"], key=lambda s: s["doc_id"])
    check(len(samples) == docs, "%s: lm-eval scored %d of %d documents" % (kernel, len(samples), docs))
    requests = [arg for s in samples for arg in s["arguments"]]
    reported = [r[0] for s in samples for r in s["filtered_resps"]]
    direct = direct_loglikelihoods(model_dir, attention, requests)
    worst = max(abs(a - b) for a, b in zip(reported, direct))
    print("[lm-eval] %s (%s): acc %.4f; worst |lm-eval - direct| log-likelihood %.2e over %d choices" % (
        kernel, attention, res["results"]["tiny_mc"]["acc,none"], worst, len(direct)))
    check(worst <= 1e-4, "%s: lm-eval's log-likelihoods differ from transformers' by %.3g" % (kernel, worst))
    acc, i = 0, 0
    for s in samples:
        n = len(s["arguments"])
        scores = direct[i:i + n]
        acc += scores.index(max(scores)) == s["doc"]["gold"]
        i += n
    check(abs(acc / docs - res["results"]["tiny_mc"]["acc,none"]) < 1e-9,
          "%s: lm-eval acc %s, argmax of the direct log-likelihoods %s" % (kernel, res["results"]["tiny_mc"]["acc,none"],
                                                                          acc / docs))
    return requests, direct, res["results"]["tiny_mc"]["acc,none"]


def command_line_acc(model_dir, task_dir, work):
    """The documented command (tools/lm_eval_darkformer.py: the plug-in, then lm-eval's own CLI) gives the
    accuracy the in-process run gave."""
    out = os.path.join(work, "lm-eval-out")
    wrapper = os.path.join(testkit.SOURCE_DIR, "tools", "lm_eval_darkformer.py")
    result = subprocess.run([sys.executable, wrapper, "--model", "hf", "--model_args",
                             "pretrained=%s,attn_implementation=darkformer,dtype=float32" % model_dir, "--tasks", "tiny_mc",
                             "--include_path", task_dir, "--device", "cpu", "--batch_size", "1", "--output_path", out],
                            capture_output=True, text=True, timeout=300)
    check(result.returncode == 0, "tools/lm_eval_darkformer.py exited %d: %s" % (result.returncode, result.stderr[-2000:]))
    files = [os.path.join(d, f) for d, _, fs in os.walk(out) for f in fs if f.startswith("results") and f.endswith(".json")]
    check(len(files) == 1, "lm-eval's command line wrote %d results files" % len(files))
    if not files:
        return None
    acc = json.load(open(files[0]))["results"]["tiny_mc"]["acc,none"]
    print("[lm-eval] command line, darkformer: acc %.4f" % acc)
    return acc


def write_generation_task(task_dir):
    """A generate_until task: lm-eval left-pads a batch of prompts and passes the mask to generate."""
    data = os.path.join(task_dir, "tiny_gen.jsonl")
    with open(data, "w") as f:
        for i, d in enumerate(testkit.corpus_documents(12, seed=4)):
            words = d.split()
            f.write(json.dumps({"context": " ".join(words[:3 + i % 5]), "answer": words[3 + i % 5]}) + "\n")
    with open(os.path.join(task_dir, "tiny_gen.yaml"), "w") as f:
        f.write("task: tiny_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: %s\ntest_split: test\n"
                "output_type: generate_until\ndoc_to_text: \"{{context}}\"\ndoc_to_target: \"{{answer}}\"\n"
                "generation_kwargs:\n  until: [\"\\n\\n\"]\n  max_gen_toks: 8\n  do_sample: false\n"
                "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n" % data)


def responses(model_dir, task_dir, task, batch_size, dtype):
    """lm-eval's raw responses for `task`, document by document."""
    import lm_eval
    from lm_eval.tasks import TaskManager
    res = lm_eval.simple_evaluate(model="hf", model_args="pretrained=%s,dtype=%s,attn_implementation=darkformer" % (
        model_dir, dtype), tasks=[task], task_manager=TaskManager(include_path=task_dir, include_defaults=False),
        device="cpu", batch_size=batch_size, log_samples=True)
    return [r for s in sorted(res["samples"][task], key=lambda s: s["doc_id"]) for r in s["resps"]]


def check_batches(model_dir, task_dir, direct):
    """--batch_size 4: the log-likelihoods computed directly, one request at a time (lm-eval right-pads
    its rows without a mask: causal attention never reads the pads), within the 1e-4 asked above; and
    --batch_size 1's generations (left-padded, with the mask: feature kernels leave the pads out)
    token for token, in fp64 so that no near-tie of the greedy choice can flip."""
    four = [r[0][0] for r in responses(model_dir, task_dir, "tiny_mc", 4, "float32")]
    worst = max(abs(a - b) for a, b in zip(four, direct))
    check(len(four) == len(direct) and worst <= 1e-4,
          "darkformer: --batch_size 4 log-likelihoods = transformers' one by one (worst %.2e)" % worst)
    one, four = (responses(model_dir, task_dir, "tiny_gen", b, "float64") for b in (1, 4))
    print("[lm-eval] generate_until, batch 1: %s" % [r[0] for r in one[:4]])
    check(one == four, "darkformer: --batch_size 4 generations = --batch_size 1")


def main():
    sys.path.insert(0, os.path.join(testkit.SOURCE_DIR, "python", "darkformer_hf"))  # the tree's plug-in
    import darkformer_hf  # noqa: F401  registers attn_implementation="darkformer" with transformers
    with tempfile.TemporaryDirectory(prefix="lm-eval-") as work:
        shards = testkit.tiny_shards(work)
        task_dir = os.path.join(work, "tasks")
        os.makedirs(task_dir)
        docs = write_task(task_dir)
        write_generation_task(task_dir)
        evaluate(export(work, shards, "exact", None), "sdpa", task_dir, docs, "exact")
        dark_dir = export(work, shards, "darkformer", {"num_features": 16, "chunk_size": 8})
        requests, ours, acc = evaluate(dark_dir, "darkformer", task_dir, docs, "darkformer")
        cli_acc = command_line_acc(dark_dir, task_dir, work)
        check(cli_acc == acc, "command line acc %s, in-process %s" % (cli_acc, acc))
        check_batches(dark_dir, task_dir, ours)
        softmax = direct_loglikelihoods(dark_dir, "sdpa", requests)  # the same weights, softmax attention
        diff = max(abs(a - b) for a, b in zip(ours, softmax))
        print("[lm-eval] darkformer vs the same weights under softmax attention: max |diff| %.3g" % diff)
        # 1e-4: 40x the lm-eval / transformers agreement asked above (a tiny model 4 steps from its init
        # attends weakly, so the kernel moves log-likelihoods by ~1e-3 only).
        check(diff > 1e-4, "the plug-in did not change the attention (max difference %.3g)" % diff)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
