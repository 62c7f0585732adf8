"""`darkformer kernel-check --bench`'s model FLOPs and the options its JSON lines carry.

The GFLOP/s of a row times its median ms is the call's model FLOPs: three times the forward that
src/attention/attention_flops.h states, written out here from that statement (m features, V = D + 1,
chunk C, per query head features 2 D m, intra-chunk products 2 C (m + V), state read 2 m V; per key
row features 2 D m and state update 2 m V; key rows per query head for darkformer's per-head maps,
per KV head for performer's shared one), and exact attention's causal lower triangle, 2 L^2 D per
head forward. With 4 query heads and 1 KV head the two maps differ, so a count that took either's key
side the other's way fails. Each row's num_features and chunk_size are the kernel's as it read them,
its defaults included. CPU, tiny sizes: a few seconds."""

import os
import sys
import tempfile

import yaml

import testkit as tk

H, K, D, L, M, C = 4, 1, 16, 64, 16, 16


def forward_per_token(key_rows):
    v = D + 1
    return H * (2 * D * M + 2 * C * (M + v) + 2 * M * v) + key_rows * (2 * D * M + 2 * M * v)


def bench(tmp, kernel, options):
    path = os.path.join(tmp, kernel + ".jsonl")
    res = tk.run(["kernel-check", "--bench", "--kernel", kernel, "--options", options, "--heads", H, "--kv-heads", K,
                  "--bench-head-dims", D, "--bench-lengths", L, "--repeats", 1, "--json", path])
    if res.returncode != 0:
        print(res.stderr[-2000:])
        return {}
    return {row["impl"]: row for row in tk.read_jsonl(path)}


def main():
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory(prefix="kernel-bench-flops-") as tmp:
        options = "{num_features: %d, chunk_size: %d}" % (M, C)
        expected = {"darkformer": 3 * L * forward_per_token(H), "performer": 3 * L * forward_per_token(K),
                    "exact": 3 * 2 * H * L * L * D}
        for kernel in ("darkformer", "performer"):
            rows = bench(tmp, kernel, options)
            for impl, want in ((kernel, expected[kernel]), ("exact", expected["exact"])):
                row = rows.get("auto" if impl == kernel else impl)
                # flops / (ms 1e6), then times ms 1e6: a few doubles' roundings, ~2^-50 relative.
                got = row["gflops"] * row["ms_median"] * 1e6 if row else None
                check(got is not None and abs(got - want) <= 1e-9 * want,
                      "%s bench, %s row: %s model FLOPs, expected %d" % (kernel, impl, got, want))
            row = rows.get("auto") or {}
            check(row.get("num_features") == M and row.get("chunk_size") == C,
                  "%s row carries num_features %s, chunk_size %s as given" % (kernel, row.get("num_features"),
                                                                              row.get("chunk_size")))
            check("num_features" not in rows.get("exact", {"num_features": 0}),
                  "%s bench: the exact row carries no feature options" % kernel)
        # No options: the row carries the kernel's defaults as `darkformer config --reference` declares
        # them (SLAY's num_features is not the other kernels' 256).
        declared = yaml.safe_load(tk.run(["config", "--reference"], check=True).stdout)["attention"]["slay"]
        row = bench(tmp, "slay", "{}").get("auto") or {}
        check((row.get("num_features"), row.get("chunk_size")) == (declared["num_features"], declared["chunk_size"]),
              "slay without options: the row carries num_features %s, chunk_size %s (declared %s, %s)"
              % (row.get("num_features"), row.get("chunk_size"), declared["num_features"], declared["chunk_size"]))
    return tk.report(failures)


if __name__ == "__main__":
    sys.exit(main())
