"""lm-evaluation-harness with darkformer's attention kernels: registers the "darkformer" attention
(import darkformer_hf) and then runs lm_eval's own command line, unchanged:

    python tools/lm_eval_darkformer.py --model hf \\
        --model_args pretrained=DIR,attn_implementation=darkformer,dtype=float32 --tasks ... --batch_size 8
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "darkformer_hf"))
import darkformer_hf  # noqa: E402,F401  (registers the attention with transformers)


def main():
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print("error: lm-eval is not installed (pip install lm-eval)", file=sys.stderr)
        return 2
    return cli_evaluate()


if __name__ == "__main__":
    sys.exit(main())
