"""darkformer's attention kernels inside Hugging Face transformers.

    import darkformer_hf
    model = darkformer_hf.from_pretrained(DIR)      # a directory written by convert_hf_gemma.py to-hf
    # or, after the import: AutoModelForCausalLM.from_pretrained(DIR, attn_implementation="darkformer")

The import registers "darkformer" with transformers' AttentionInterface (and its mask function).
"""

from transformers import AttentionInterface, AutoModelForCausalLM
from transformers.masking_utils import AttentionMaskInterface

from .attention import darkformer_attention
from .loading import LayerKernel, attach, block_of
from .masks import darkformer_mask
from .spec import KernelStateError

NAME = "darkformer"
AttentionInterface.register(NAME, darkformer_attention)
AttentionMaskInterface.register(NAME, darkformer_mask)  # sdpa's masks, with their keys' padding

__all__ = ["from_pretrained", "attach", "block_of", "KernelStateError", "LayerKernel", "NAME"]


def from_pretrained(model_dir, kernel=None, **kwargs):
    """AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="darkformer", **kwargs)
    with every layer's kernel state read and checked now (not at the first forward). `kernel`,
    when given, must be a kernel the directory was trained with."""
    kwargs.setdefault("attn_implementation", NAME)
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    return attach(model, model_dir, kernel)
