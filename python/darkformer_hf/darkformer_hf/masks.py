"""The masks transformers builds for attn_implementation="darkformer": sdpa's, each carrying which
keys are padding.

A feature kernel ignores a sliding window, as the binary does, so on a sliding layer it needs
the keys that are padding beyond the window too, which the windowed mask no longer shows. The
2-D padding mask is at hand only here, where transformers builds the 4-D masks from it: each
mask keeps its keys' slice of it as an attribute, which attention.py reads."""

from transformers.masking_utils import prepare_padding_mask, sdpa_mask

KEY_PADDING = "darkformer_key_is_real"


def darkformer_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kwargs):
    """sdpa_mask, plus (B, kv_length) bool of the mask's keys that are real tokens, when there is
    a mask and a 2-D padding mask to take it from."""
    mask = sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if mask is not None and padding is not None:
        setattr(mask, KEY_PADDING, padding[:, kv_offset:kv_offset + kv_length].bool())
    return mask


def key_is_real(attention_mask):
    """The (B, S) bool a darkformer mask carries, or None (a 4-D mask given by the caller)."""
    return getattr(attention_mask, KEY_PADDING, None)
