"""The summary of tools/gpu_check.sh: summary.json and summary.md in OUT, from what its stages left
there (stages.tsv, junit.xml of the device tests, bench/*.jsonl, hf.json, logs/ncu.csv).

usage: gpu_check_summary.py OUT DEVICE
"""
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

import ncu_table


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tests_summary(path):
    if not os.path.exists(path):
        return None
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    passed, failed = [], []
    for case in cases:
        bad = case.find("failure") is not None or case.find("error") is not None or case.get("status") == "fail"
        (failed if bad else passed).append(case.get("name"))
    return {"passed": len(passed), "failed": len(failed), "failed_names": failed}


def main():
    out, device = sys.argv[1], sys.argv[2]
    machine = open(os.path.join(out, "logs", "machine.log")).read().strip().splitlines()
    stages = []
    with open(os.path.join(out, "stages.tsv")) as f:
        for line in f:
            name, status, seconds = line.rstrip("\n").split("\t")
            stages.append({"stage": name, "status": status, "seconds": int(seconds)})
    build_log = os.path.join(out, "logs", "build.log")
    if os.path.exists(build_log) and "gpu_prebuilt: installed" in open(build_log).read():
        for stage in stages:  # the binaries packed before the lease (tools/gpu_prebuilt.sh)
            if stage["stage"] == "build" and stage["status"] == "ok":
                stage["status"] = "ok (prebuilt)"
    kernels = [r for p in sorted(glob.glob(os.path.join(out, "bench", "kernels_*.jsonl"))) for r in read_jsonl(p)]
    documents = [r for p in sorted(glob.glob(os.path.join(out, "bench", "documents_*.jsonl"))) for r in read_jsonl(p)]
    fla_path = os.path.join(out, "bench", "fla.jsonl")
    fla = read_jsonl(fla_path) if os.path.exists(fla_path) else []
    steps_path = os.path.join(out, "bench", "steps.jsonl")
    steps = read_jsonl(steps_path) if os.path.exists(steps_path) else []
    hf_path = os.path.join(out, "hf.json")
    hf = json.load(open(hf_path)) if os.path.exists(hf_path) else None
    ncu_path = os.path.join(out, "logs", "ncu.csv")
    ncu = ncu_table.kernel_rows(ncu_table.read_launches(ncu_path)) if os.path.exists(ncu_path) else []
    summary = {"device": device, "machine": machine, "stages": stages,
               "tests": tests_summary(os.path.join(out, "junit.xml")),
               "kernels": [{k: r.get(k) for k in ("kernel", "impl", "chunk_size", "sub_chunk", "segment_chunks", "pairs",
                                                  "precompute_features",
                                                  "dtype",
                                                  "computes_in", "length",
                                                  "ms_median", "peak_mib", "ops_forward", "ops_backward",
                                                  "speedup_vs_exact", "memory_vs_exact")}
                           for r in kernels],
               "fla": fla,
               "documents": [{k: r.get(k) for k in ("kernel", "impl", "length", "batch", "documents_mean_length",
                                                    "ms_median", "peak_mib", "time_vs_unmasked")} for r in documents],
               "steps": steps, "hf": hf, "ncu": ncu}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)

    md = ["# GPU check on %s" % device, "", *["- " + m for m in machine], "",
          "| stage | status | s |", "|---|---|---|"]
    md += ["| %s | %s | %d |" % (s["stage"], s["status"], s["seconds"]) for s in stages]
    t = summary["tests"]
    if t:
        md += ["", "Device tests: %d passed, %d failed" % (t["passed"], t["failed"])]
        md += ["- failed: " + n for n in t["failed_names"]]
    if kernels:
        md += ["", "Attention alone, forward + backward (exact: SDPA, timed beside each kernel in the same run)", "",
               "| kernel | impl | dtype | computes in | L | ms | peak MiB | ops fwd/bwd | vs exact | memory/exact |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(kernels, key=lambda r: (r["kernel"], r.get("dtype") or "", r["length"], r["impl"],
                                                r.get("chunk_size") or 0, r.get("sub_chunk") or 0,
                                                r.get("segment_chunks") or 0, r.get("pairs") or "",
                                                bool(r.get("precompute_features")))):
            # op: cuda's rows say how they were cut: chunk / sub-chunk, the chunks per segment where
            # its key gave them (" g<n>"; else at most what the device runs at once), and " x" where
            # its pairs ran by exponentials throughout (its key pairs; else products where they factor),
            # " p" where its features were precomputed (its key precompute_features; else inside).
            impl = r["impl"] + (" %s/%s" % (r.get("chunk_size"), r["sub_chunk"]) if "sub_chunk" in r else "")
            impl += " g%s" % r["segment_chunks"] if r.get("segment_chunks") else ""
            impl += " x" if r.get("pairs") == "exponentials" else ""
            impl += " p" if r.get("precompute_features") else ""
            md.append("| %s | %s | %s | %s | %d | %.2f | %.0f | %s/%s | %s | %s |" % (
                r["kernel"], impl, r.get("dtype", "fp32"), r.get("computes_in") or "-", r["length"],
                r["ms_median"], r["peak_mib"], r.get("ops_forward", "-"), r.get("ops_backward", "-"),
                "%.2fx" % r["speedup_vs_exact"] if r.get("speedup_vs_exact") is not None else "-",
                "%.2f" % r["memory_vs_exact"] if r.get("memory_vs_exact") is not None else "-"))
    if fla:
        md += ["", "fla's chunk_linear_attn with Performer features (tools/bench_fla.py), against SDPA in its process",
               "", "| dtype | L | ms | peak MiB | vs exact | memory/exact |", "|---|---|---|---|---|---|"]
        for r in fla:
            if "skipped" in r:
                md.append("| %s | %d | skipped: %s | | | |" % (r["dtype"], r["length"], r["skipped"]))
            else:
                md.append("| %s | %d | %.2f | %.0f | %.2fx | %.2f |" % (
                    r["dtype"], r["length"], r["ms_median"], r["peak_mib"], r["speedup_vs_exact"], r["memory_vs_exact"]))
    masked = [r for r in documents if r.get("time_vs_unmasked") is not None]
    if masked:
        md += ["", "Packed documents (data.document_masking): each implementation against its own unmasked time",
               "", "| kernel | impl | L | mean document | ms | peak MiB | x unmasked |", "|---|---|---|---|---|---|---|"]
        for r in masked:
            md.append("| %s | %s | %d | %d | %.2f | %.0f | %.2fx |" % (
                r["kernel"], r["impl"], r["length"], r.get("documents_mean_length", 0), r["ms_median"], r["peak_mib"],
                r["time_vs_unmasked"]))
    if steps:
        md += ["", "The q/k/v-only finetuning step (bf16 autocast, checkpointing, chunked loss)", "",
               "| kernel | batch x tokens | ms | tokens/s | MFU | peak GiB | allocator GiB | predicted GiB | loss |",
               "|---|---|---|---|---|---|---|---|---|"]
        for s in steps:
            md.append("| %s | %s x %s | %.0f | %.0f | %.1f %% | %.2f | %s | %s | %.4f -> %.4f |" % (
                s.get("kernel", "-"), s.get("batch", "-"), s.get("seq_len", s["tokens"]), s["step_ms_median"],
                s["tokens_per_s"], 100 * s["mfu"], s["peak_memory_gib"],
                "%.2f" % s["allocator_peak_gib"] if "allocator_peak_gib" in s else "-",
                "%.2f" % s["predicted_peak_gib"] if "predicted_peak_gib" in s else "-", s["loss_first"], s["loss_last"]))
    if ncu:
        md += ["", "Nsight Compute on op: cuda's launches (stage ncu; clocks as found, caches flushed per launch)", ""]
        md += ncu_table.markdown(ncu)
    if hf:
        md += ["", "transformers on %s against the fixtures' CPU numbers:" % device]
        md += ["- %s: logits max |diff| %.3g, loss rel %.3g" % (r["family"], r["logits_max_diff"], r["loss_rel"])
               for r in hf["families"]]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
