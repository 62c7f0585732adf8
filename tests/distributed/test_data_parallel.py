"""Data-parallel training: `darkformer train` as a torchrun worker, Gloo on loopback, 2 CPU ranks.

Each case drives the real binary. Ranks are started either by torchrun from the project venv
(`--no-python`) or by setting the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) ourselves, which lets a case watch and kill one rank.

    python test_data_parallel.py CASE     # one case: exit 0 pass, 1 fail
    python test_data_parallel.py --list
"""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import testkit as tk  # noqa: E402

CASES = {}
failures = []
TORCHRUN = os.path.join(os.path.dirname(os.environ.get("DARKFORMER_PYTHON") or
                                        os.path.join(tk.SOURCE_DIR, ".venv", "bin", "python")), "torchrun")
REL_TOL = 1e-5


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def check(ok, what, detail=""):
    print("%s %s%s" % ("ok  " if ok else "FAIL", what, (": " + detail) if detail and not ok else ""))
    if not ok:
        failures.append(what)
    return ok


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp, name, kernel="exact", **sections):
    run_dir = os.path.join(tmp, name)
    base = {"train": {"steps": 10, "checkpoint_every": 5, "warmup_steps": 2, "lr": 3e-3,
                      "distributed": {"timeout_s": 30}},
            "data": {"batch_size": 4}}
    config = tk.run_config(run_dir, tk.tiny_shards(tmp), kernel=kernel, **tk.deep_merge(base, sections))
    path = os.path.join(tmp, name + ".yaml")
    tk.write_yaml(path, config)
    return path, run_dir


def rank_env(rank, world, port):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("TORCHELASTIC_"):
            del env[k]
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    return env


def start_ranks(config, world, *sets, ranks=None):
    """Starts ranks (all by default) of a `world`-rank job; returns the Popen objects."""
    port = free_port()
    args = [tk.BINARY, "train", "--config", config, *[a for s in sets for a in ("--set", s)]]
    return [subprocess.Popen(args, env=rank_env(r, world, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for r in (range(world) if ranks is None else ranks)]


def finish(procs, timeout=300):
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            stderr += "\n[test] killed after %d s" % timeout
        out.append((p.returncode, stderr))
    return out


def train_single(config, *sets, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    args = [tk.BINARY, "train", "--config", config, *[a for s in sets for a in ("--set", s)]]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stderr


def losses(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    return {r["step"]: r["loss"] for r in tk.read_jsonl(path) if r.get("type") == "train"}


def train_steps(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    return [r["step"] for r in tk.read_jsonl(path) if r.get("type") == "train"] if os.path.exists(path) else []


def digests(stderr):
    return re.findall(r"parameter digest ([0-9a-f]{16})", stderr)


def tail(stderr, n=4):
    return " | ".join(stderr.strip().splitlines()[-n:])


def compare_losses(got, want, steps, what):
    bad = [(s, got.get(s), want.get(s)) for s in steps
           if s not in got or s not in want or abs(got[s] - want[s]) > REL_TOL * abs(want[s])]
    worst = max((abs(got[s] - want[s]) / abs(want[s]) for s in steps if s in got and s in want), default=float("nan"))
    check(not bad, "%s: losses of steps %d-%d within %g relative (worst %.2e)" % (what, steps[0], steps[-1], REL_TOL, worst),
          "differ at %s" % bad[:3])


def expect_equal_to_single_process(tmp, kernel, launch, grad_accum=1, single_train=None, dp_train=None):
    single_cfg, single_dir = write_config(tmp, "single-" + kernel, kernel=kernel,
                                          train={"grad_accum": grad_accum, **(single_train or {})})
    rc, err = train_single(single_cfg)
    check(rc == 0, "%s: 1-process run exits 0" % kernel, tail(err))
    dp_cfg, dp_dir = write_config(tmp, "dp-" + kernel, kernel=kernel,
                                  train={"grad_accum": grad_accum, **(dp_train or {})})
    results = launch(dp_cfg)
    for r, (rc, err) in enumerate(results):
        check(rc == 0, "%s: rank %d exits 0" % (kernel, r), tail(err))
    compare_losses(losses(dp_dir), losses(single_dir), list(range(1, 11)), "%s 2 ranks vs 1 process" % kernel)
    found = digests("\n".join(err for _, err in results))
    check(len(found) == 2 and found[0] == found[1],
          "%s: both ranks end with bit-identical parameters (digests %s)" % (kernel, found))
    # Rank 0 alone wrote the run directory: one line per step.
    check(train_steps(dp_dir) == list(range(1, 11)), "%s: metrics.jsonl has steps 1-10 once" % kernel,
          str(train_steps(dp_dir)))
    return results


def launch_with_environment(config):
    return finish(start_ranks(config, 2))


def launch_with_torchrun(config):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    args = [TORCHRUN, "--no-python", "--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(port), tk.BINARY, "train", "--config", config]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    # torchrun interleaves both workers' stderr into its own; report it once for both ranks.
    return [(r.returncode, r.stderr), (r.returncode, "")]


# ---- Cases -------------------------------------------------------------------------------------

TORCH_SEARCH_WARNING = "find_unused_parameters=True was specified"


@case
def exact_matches_one_process(tmp):
    results = expect_equal_to_single_process(tmp, "exact", launch_with_environment)
    # gradient_as_bucket_view: after the first step every gradient lives in the reducer's buckets.
    views = re.findall(r"(\d+) of (\d+) gradients are views into the all-reduce buckets", results[0][1])
    check(views and views[0][0] == views[0][1], "exact: gradients are bucket views (%s)" % views)
    # find_unused_parameters: auto: exact attention gives every parameter a gradient, so no
    # search each step (nor torch's warning that one found nothing), and the buckets are rebuilt
    # once in the order gradients arrive, as DDP's.
    for r, (_, err) in enumerate(results):
        check("every one gets a gradient (no search)" in err and TORCH_SEARCH_WARNING not in err,
              "exact: rank %d searches no graph for unused parameters" % r, tail(err))
        check(err.count("gradient buckets rebuilt in the order gradients became ready") == 1,
              "exact: rank %d rebuilds its buckets once" % r, tail(err))


@case
def constant_attention_searches_for_unused_parameters(tmp):
    """Constant attention ignores q and k, so their projections get no gradient: auto searches for
    such parameters (and matches one process); false refuses them, naming one and the key."""
    results = expect_equal_to_single_process(tmp, "constant", launch_with_environment)
    for r, (_, err) in enumerate(results):
        check("each step searched for parameters without a gradient" in err,
              "constant: rank %d searches each step for parameters without a gradient" % r, tail(err))
    cfg, run_dir = write_config(tmp, "no-search", kernel="constant", train={"distributed": {"find_unused_parameters": False}})
    for r, (rc, err) in enumerate(finish(start_ranks(cfg, 2), timeout=120)):
        errors = [l for l in err.splitlines() if "[error]" in l]
        check(rc == 2 and len(errors) == 1 and "'layers.0.self_attn.q_proj.weight' got no gradient" in errors[0]
              and "train.distributed.find_unused_parameters is false" in errors[0],
              "find_unused_parameters false: rank %d exits 2 naming the parameter and the key" % r, tail(err))


@case
def darkformer_under_torchrun_matches_one_process(tmp):
    check(os.access(TORCHRUN, os.X_OK), "torchrun is in the venv (%s)" % TORCHRUN)
    # Two micro-batches per step: only the last backward all-reduces (DDP's no_sync).
    expect_equal_to_single_process(tmp, "darkformer", launch_with_torchrun, grad_accum=2)


@case
def checkpointed_qkv_only_matches_one_process(tmp):
    # q/k/v-only finetuning (a frozen embedding: the first layer's input needs no gradient) with
    # activation checkpointing and the chunked loss on 2 ranks, against one plain process: the
    # checkpointed layers' parameters reach the reducer's buckets through the outer graph.
    qkv = {"trainable": ["*q_proj*", "*k_proj*", "*v_proj*", "*.kernel.*"]}
    expect_equal_to_single_process(tmp, "darkformer", launch_with_environment, grad_accum=2, single_train=qkv,
                                   dp_train={**qkv, "activation_checkpointing": True, "loss_chunk_tokens": 24})


@case
def nan_on_one_rank_is_seen_by_all(tmp):
    # Rank 1 alone gets a NaN loss at step 3: both ranks must skip that update (on_nonfinite: skip)
    # and stay identical; with on_nonfinite: stop both must stop (exit 3).
    cfg, run_dir = write_config(tmp, "skip", train={"steps": 5, "fault_injection": {"nan_loss_at_step": 3,
                                                                                   "nan_loss_rank": 1}})
    results = finish(start_ranks(cfg, 2))
    check(all(rc == 0 for rc, _ in results), "skip: both ranks exit 0 (got %s)" % [r for r, _ in results],
          tail(results[0][1]) + " || " + tail(results[1][1]))
    rows = {r["step"]: r for r in tk.read_jsonl(os.path.join(run_dir, "metrics.jsonl")) if r.get("type") == "train"}
    check(3 in rows and rows[3]["skipped"] and not rows[2]["skipped"], "step 3 is logged as skipped",
          str(rows.get(3)))
    found = digests("\n".join(err for _, err in results))
    check(len(found) == 2 and found[0] == found[1], "the replicas stay bit-identical (digests %s)" % found)
    cfg, run_dir = write_config(tmp, "stop", train={"steps": 5, "spikes": {"on_nonfinite": "stop"},
                                                    "fault_injection": {"nan_loss_at_step": 3, "nan_loss_rank": 1}})
    results = finish(start_ranks(cfg, 2))
    check(all(rc == 3 for rc, _ in results), "stop: both ranks exit 3 at the NaN (got %s)" % [r for r, _ in results],
          tail(results[0][1]) + " || " + tail(results[1][1]))
    check(os.path.exists(os.path.join(run_dir, "nonfinite.json")), "rank 0 wrote nonfinite.json")


@case
def rewind_on_two_ranks_matches_one_process(tmp):
    # An lr times 300 on data batches 20-21 diverges the run; both ranks must rewind together, to
    # the step and data position one process rewinds to, and stay bit-identical replicas.
    train = {"steps": 30, "checkpoint_every": 5, "keep_last": 1, "schedule": "constant", "grad_clip": 0,
             "spikes": {"window": 10, "min_history": 8, "on_divergence": "rewind",
                        "divergence": {"spikes": 2, "window": 10}, "rewind": {"skip_batches": 3}},
             "fault_injection": {"lr_multiplier_at_step": {"step": 20, "factor": 300, "steps": 2}}}
    single_cfg, single_dir = write_config(tmp, "single", train=train)
    rc, err = train_single(single_cfg)
    check(rc == 0, "1 process rewinds and finishes", tail(err))
    dp_cfg, dp_dir = write_config(tmp, "dp", train=train)
    results = finish(start_ranks(dp_cfg, 2))
    check(all(rc == 0 for rc, _ in results), "both ranks rewind and finish (got %s)" % [r for r, _ in results],
          tail(results[0][1]) + " || " + tail(results[1][1]))
    rows = [tk.read_jsonl(os.path.join(d, "rewinds.jsonl")) if os.path.exists(os.path.join(d, "rewinds.jsonl")) else []
            for d in (single_dir, dp_dir)]
    keys = ("from_step", "to_step", "first_bad_step", "batches_skipped", "data_resumes_at")
    check(len(rows[0]) == 1 and [{k: r[k] for k in keys} for r in rows[1]] == [{k: r[k] for k in keys} for r in rows[0]],
          "2 ranks rewind as 1 process does (%s)" % [{k: r[k] for k in keys} for r in rows[0]],
          str(rows[1]))
    check(all("rewind 1 of at most 3" in err for _, err in results), "each rank logged the rewind")
    compare_losses(losses(dp_dir), losses(single_dir), list(range(1, 31)), "rewound: 2 ranks vs 1 process")
    found = digests("\n".join(err for _, err in results))
    check(len(found) == 2 and found[0] == found[1], "the replicas stay bit-identical (digests %s)" % found)


@case
def resume_two_ranks_on_one(tmp):
    # An uninterrupted 1-process run of 8 steps ...
    ref_cfg, ref_dir = write_config(tmp, "ref", kernel="darkformer", train={"steps": 8, "checkpoint_every": 0})
    rc, err = train_single(ref_cfg)
    check(rc == 0, "uninterrupted run exits 0", tail(err))
    # ... against 2 ranks stopped at step 4 (as SIGINT would) and 1 process finishing it.
    cfg, run_dir = write_config(tmp, "run", kernel="darkformer", train={"steps": 8, "checkpoint_every": 0})
    results = finish(start_ranks(cfg, 2, "train.fault_injection.stop_at_step=4"))
    check(all(rc == 130 for rc, _ in results), "2 ranks stop at step 4 with exit 130 (got %s)" % [r for r, _ in results],
          tail(results[0][1]))
    check(os.path.exists(os.path.join(run_dir, "checkpoints", "step_00000004.h5")), "a checkpoint of step 4")
    rc, err = train_single(cfg)
    check(rc == 0, "1 process resumes and finishes", tail(err))
    check("resumed from" in err and "at step 4" in err, "it resumed at step 4", tail(err))
    compare_losses(losses(run_dir), losses(ref_dir), list(range(1, 9)), "2 ranks then 1 vs uninterrupted")
    check(train_steps(run_dir) == list(range(1, 9)), "metrics.jsonl has steps 1-8 once", str(train_steps(run_dir)))


@case
def killed_rank_ends_the_job(tmp):
    cfg, run_dir = write_config(tmp, "run", train={"steps": 100000, "checkpoint_every": 2,
                                                    "distributed": {"timeout_s": 20}})
    procs = start_ranks(cfg, 2)
    deadline = time.time() + 120
    while time.time() < deadline and len(train_steps(run_dir)) < 5 and all(p.poll() is None for p in procs):
        time.sleep(0.2)
    check(len(train_steps(run_dir)) >= 5, "the job trains (%d steps logged)" % len(train_steps(run_dir)))
    procs[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    rc, err = finish([procs[0]], timeout=90)[0]
    waited = time.time() - killed_at
    procs[1].wait()
    check(rc not in (0, None) and waited < 60, "rank 0 exits non-zero %.1f s after rank 1 was killed (exit %s)"
          % (waited, rc), tail(err))
    check("data parallel" in err and "rank 0 of 2" in err, "its error names the data-parallel failure", tail(err))
    print("     " + next((line for line in err.splitlines() if "[error]" in line), "(no error line)"))
    # The newest checkpoint loads: one process resumes from it and trains two more steps.
    ckpts = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "step_*.h5")))
    check(bool(ckpts), "a checkpoint survives")
    if ckpts:
        step = int(re.search(r"step_(\d+)", ckpts[-1]).group(1))
        rc, err = train_single(cfg, "train.steps=%d" % (step + 2))
        check(rc == 0 and "at step %d" % step in err, "1 process resumes from step %d and finishes" % step, tail(err))


@case
def rendezvous_without_peer_times_out(tmp):
    cfg, _ = write_config(tmp, "run", train={"distributed": {"timeout_s": 5}})
    start = time.time()
    rc, err = finish(start_ranks(cfg, 2, ranks=[1]), timeout=60)[0]
    took = time.time() - start
    check(rc == 2 and took < 30, "rank 1 alone exits 2 (bad input) after %.1f s (exit %s)" % (took, rc), tail(err))
    check("could not join" in err and "train.distributed.timeout_s" in err,
          "the error says the group could not be joined, naming the key", tail(err))
    check("frame #" not in err and "Exception raised from" not in err and "[c10d]" not in err,
          "one error line: no c10d stack dump", tail(err))


@case
def indivisible_global_batch(tmp):
    cfg, _ = write_config(tmp, "run", data={"batch_size": 3})
    results = finish(start_ranks(cfg, 2), timeout=60)
    for r, (rc, err) in enumerate(results):
        check(rc == 2 and "'data.batch_size' (3" in err and "2 data-parallel ranks" in err,
              "rank %d: exit 2 naming data.batch_size and the 2 ranks" % r, tail(err))


@case
def ranks_with_different_configs(tmp):
    """Each rank exits 2 at once naming the first key that differs, never a Gloo abort or a timeout."""
    cfg, _ = write_config(tmp, "run")
    for key, zero, one in (("train.steps", "10", "6"), ("model.hidden_size", "32", "48"),
                           ("attention.kernel", "exact", "performer")):
        port = free_port()
        procs = [subprocess.Popen([tk.BINARY, "train", "--config", cfg, *([] if r == 0 else ["--set", key + "=" + one])],
                                  env=rank_env(r, 2, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        start = time.time()
        results = finish(procs, timeout=60)
        took = time.time() - start
        for r, (rc, err) in enumerate(results):
            errors = [l for l in err.splitlines() if "[error]" in l]
            named = errors and "config key '%s' differs between ranks: rank 0 has %s, rank 1 has %s" % (key, zero, one) in errors[0]
            check(rc == 2 and len(errors) == 1 and named and "EnforceNotMet" not in err and "terminate" not in err,
                  "%s differs: rank %d exits 2 with one line naming it" % (key, r), tail(err))
        check(took < 20, "%s differs: the ranks stop at once (%.1f s), without waiting for a timeout" % (key, took))


@case
def sweep_runs_under_torchrun(tmp):
    cfg, _ = write_config(tmp, "base", train={"steps": 4})
    sweep = os.path.join(tmp, "sweep.yaml")
    tk.write_yaml(sweep, {"base": cfg, "output": os.path.join(tmp, "sweep"), "grid": {"train.lr": [0.001]},
                          "launcher": {"torchrun": TORCHRUN, "nproc_per_node": 2}})
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run([tk.BINARY, "sweep", "--config", sweep], env=env, capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, "the sweep exits 0", tail(r.stderr))
    run_dir = os.path.join(tmp, "sweep", "lr0.001")
    log = open(os.path.join(run_dir, "train.log"), encoding="utf-8").read() if os.path.exists(
        os.path.join(run_dir, "train.log")) else ""
    check("rank 1 of 2" in log, "its run trained as 2 torchrun ranks", log[-500:])
    check(train_steps(run_dir) == [1, 2, 3, 4], "the run logged steps 1-4", str(train_steps(run_dir)))


def main(argv):
    return tk.run_case_main(argv, CASES, failures, "df-dp")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
