"""transformers itself on a device against the fixtures' CPU numbers (tests/fixtures/*/reference.h5,
written by tools/make_reference.py): the stage `hf` of tools/gpu_check.sh. With the device tests'
HfFixtureOnDeviceTest (ours on the device against the same numbers) it closes the triangle: ours
and transformers agree on the device as they do on the CPU. fp32, TF32 off, eager attention.

  python3 tools/hf_parity_device.py --device cuda --json hf.json
"""
import argparse
import json
import os
import sys

import h5py
import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("gemma", "gemma2", "gemma3")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--logits-tol", type=float, default=1e-4, help="the CPU test's bound (hf_reference_test.cpp)")
    p.add_argument("--loss-tol", type=float, default=1e-5)
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows, failed = [], []
    for family in FAMILIES:
        fixture = os.path.join(ROOT, "tests", "fixtures", family)
        with h5py.File(os.path.join(fixture, "reference.h5"), "r") as h5:
            input_ids = torch.from_numpy(h5["input_ids"][()])
            ref_logits = torch.from_numpy(h5["logits"][()])
            ref_loss = float(h5["loss"][()])
        model = transformers.AutoModelForCausalLM.from_pretrained(fixture, attn_implementation="eager",
                                                                  dtype=torch.float32).to(args.device).eval()
        with torch.no_grad():
            out = model(input_ids=input_ids.to(args.device), labels=input_ids.to(args.device))
        row = {"family": family, "device": args.device,
               "logits_max_diff": (out.logits.float().cpu() - ref_logits).abs().max().item(),
               "loss_rel": abs(out.loss.item() - ref_loss) / abs(ref_loss)}
        print("[hf_parity] %s on %s: logits max |diff| %.3g, loss rel %.3g" % (
            family, args.device, row["logits_max_diff"], row["loss_rel"]))
        rows.append(row)
        if row["logits_max_diff"] > args.logits_tol or row["loss_rel"] > args.loss_tol:
            failed.append(family)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"transformers": transformers.__version__, "families": rows}, f, indent=1)
    if failed:
        sys.exit("beyond the CPU test's bounds: " + ", ".join(failed))


if __name__ == "__main__":
    main()
