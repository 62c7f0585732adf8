"""Gemma 1/2/3 model configs between Hugging Face's config.json and ours (convert_hf_gemma.py's
config half): the keys we write, their types, families and the mapping both ways."""

import sys

import yaml

# Keys of our model config, in the order they are written.
CONFIG_KEYS = [
    "family", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
    "rope_local_theta", "rope_scaling_factor", "max_position_embeddings", "query_pre_attn_scalar",
    "attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "layer_types",
    "pad_token_id", "bos_token_id", "eos_token_id",
]
INT_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window",
            "pad_token_id", "bos_token_id", "eos_token_id")
LAYER_TYPES = ("full_attention", "sliding_attention")
FAMILY_OF_MODEL_TYPE = {"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3"}
ARCHITECTURE_OF_FAMILY = {
    "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3": "Gemma3ForCausalLM"}


class ConversionError(Exception):
    """A checkpoint or file that this converter cannot represent faithfully."""


# ----------------------------------------------------------------------------- config mapping

def effective_query_pre_attn_scalar(value, head_dim, where):
    """The one rule for query_pre_attn_scalar: unset (None) or 0 means head_dim, else a positive
    number. Both directions of the conversion go through here."""
    try:
        scalar = 0.0 if value is None else float(value)
    except (TypeError, ValueError):
        raise ConversionError(f"{where}: query_pre_attn_scalar {value!r} is not a number") from None
    if scalar < 0 or scalar != scalar:
        raise ConversionError(f"{where}: query_pre_attn_scalar must be positive (or 0 for head_dim), "
                              f"got {value!r}")
    return float(head_dim) if scalar == 0 else scalar


def normalise_config(cfg, where="config_yaml"):
    """Our config dict, checked (every key present, numbers are numbers) and with
    query_pre_attn_scalar made explicit (0 -> head_dim). Idempotent."""
    if not isinstance(cfg, dict):
        raise ConversionError(f"{where} is not a mapping")
    missing = [k for k in CONFIG_KEYS if k not in cfg]
    if missing:
        raise ConversionError(f"{where} lacks keys {missing}")
    if cfg["family"] not in ARCHITECTURE_OF_FAMILY:
        raise ConversionError(f"{where}: unknown family '{cfg['family']}' "
                              f"(expected one of {', '.join(ARCHITECTURE_OF_FAMILY)})")
    out = dict(cfg)
    for key in CONFIG_KEYS:
        value = cfg[key]
        if key in ("family", "layer_types"):
            continue
        kind = int if key in INT_KEYS else float
        try:  # strings too: YAML reads "1e-06" (no dot) as one
            number = None if isinstance(value, bool) else float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or (kind is int and not number.is_integer()):
            raise ConversionError(f"{where}: key '{key}' must be {'an integer' if kind is int else 'a number'}, "
                                  f"got {value!r}")
        out[key] = kind(number)
    if not isinstance(cfg["layer_types"], list):
        raise ConversionError(f"{where}: key 'layer_types' must be a list, got {cfg['layer_types']!r}")
    out["query_pre_attn_scalar"] = effective_query_pre_attn_scalar(
        cfg["query_pre_attn_scalar"], out["head_dim"], where)
    return out


def _int_id(value, name):
    # Our config holds one int per special token; HF allows None or a list (Gemma 3 -it has two eos).
    if value is None:
        return -1
    if isinstance(value, (list, tuple)):
        if len(value) > 1:
            print(f"warning: {name} has several values {list(value)}; keeping the first",
                  file=sys.stderr)
        return int(value[0])
    return int(value)


def _rope_settings(rope, where):
    """(theta, linear factor) of one HF rope_parameters dict."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "linear"):
        raise ConversionError(f"{where}: rope type '{rope_type}' is not supported (only default, linear)")
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ConversionError(f"{where}: partial_rotary_factor is not supported")
    factor = float(rope["factor"]) if rope_type == "linear" else 1.0
    return float(rope["rope_theta"]), factor


def our_config_from_hf(hf):
    """Maps a transformers config object (defaults filled by HF) to our config dict."""
    if hf.model_type == "gemma3":  # multimodal wrapper: the language model is its text_config
        hf = hf.text_config
    family = FAMILY_OF_MODEL_TYPE.get(hf.model_type)
    if family is None:
        raise ConversionError(f"unsupported model_type '{hf.model_type}' "
                              f"(supported: {', '.join(FAMILY_OF_MODEL_TYPE)}, gemma3)")
    # Gemma 1 calls it hidden_act and HF already maps the legacy "gelu" to the tanh form there;
    # Gemma 2/3 run whatever hidden_activation names, so a plain "gelu" would be exact GELU.
    act = hf.hidden_act if family == "gemma" else hf.hidden_activation
    if act != "gelu_pytorch_tanh" and not (family == "gemma" and act == "gelu"):
        raise ConversionError(f"hidden activation '{act}' is not supported (only gelu_pytorch_tanh)")
    if getattr(hf, "attention_bias", False):
        raise ConversionError("attention_bias=True is not supported")
    if getattr(hf, "use_bidirectional_attention", False):
        raise ConversionError("use_bidirectional_attention=True is not supported")

    n_layers = int(hf.num_hidden_layers)
    rope = hf.rope_parameters
    if family == "gemma3":
        theta, factor = _rope_settings(rope["full_attention"], "rope_parameters.full_attention")
        local_theta, local_factor = _rope_settings(rope["sliding_attention"],
                                                   "rope_parameters.sliding_attention")
        if local_factor != 1.0:
            raise ConversionError("linear RoPE scaling on sliding_attention layers is not supported")
    else:
        theta, factor = _rope_settings(rope, "rope_parameters")
        local_theta = theta
    layer_types = ["full_attention"] * n_layers if family == "gemma" else list(hf.layer_types)
    if len(layer_types) != n_layers or any(t not in LAYER_TYPES for t in layer_types):
        raise ConversionError(f"layer_types must list {n_layers} of {LAYER_TYPES}, got {layer_types}")
    # Our rope_scaling_factor applies to full-attention layers only; Gemma 1/2 scale every layer.
    if factor != 1.0 and "sliding_attention" in layer_types and family != "gemma3":
        raise ConversionError("linear RoPE scaling with sliding_attention layers is only supported "
                              "for gemma3 (which scales full_attention layers only)")

    head_dim = int(hf.head_dim)
    sliding = 0 if family == "gemma" else (getattr(hf, "sliding_window", None) or 0)
    return {
        "family": family,
        "vocab_size": int(hf.vocab_size),
        "hidden_size": int(hf.hidden_size),
        "intermediate_size": int(hf.intermediate_size),
        "num_hidden_layers": n_layers,
        "num_attention_heads": int(hf.num_attention_heads),
        "num_key_value_heads": int(hf.num_key_value_heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(hf.rms_norm_eps),
        "rope_theta": theta,
        "rope_local_theta": local_theta,
        "rope_scaling_factor": factor,
        "max_position_embeddings": int(hf.max_position_embeddings),
        # Gemma 1 scales scores by head_dim**-0.5, i.e. query_pre_attn_scalar = head_dim; our file
        # always states the number, never 0.
        "query_pre_attn_scalar": effective_query_pre_attn_scalar(
            None if family == "gemma" else hf.query_pre_attn_scalar, head_dim, "config.json"),
        "attn_logit_softcapping": float(getattr(hf, "attn_logit_softcapping", None) or 0.0),
        "final_logit_softcapping": float(getattr(hf, "final_logit_softcapping", None) or 0.0),
        "sliding_window": int(sliding),
        "layer_types": layer_types,
        "pad_token_id": _int_id(hf.pad_token_id, "pad_token_id"),
        "bos_token_id": _int_id(hf.bos_token_id, "bos_token_id"),
        "eos_token_id": _int_id(hf.eos_token_id, "eos_token_id"),
    }


def hf_config_from_ours(cfg, dtype_name):
    """Builds the transformers config object matching our config dict."""
    import transformers

    cfg = normalise_config(cfg)
    family = cfg["family"]

    def rope(theta, factor):
        if float(factor) == 1.0:
            return {"rope_type": "default", "rope_theta": float(theta)}
        return {"rope_type": "linear", "rope_theta": float(theta), "factor": float(factor)}

    def token(v):
        return None if int(v) < 0 else int(v)

    common = dict(
        vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_hidden_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=int(cfg["num_attention_heads"]),
        num_key_value_heads=int(cfg["num_key_value_heads"]), head_dim=int(cfg["head_dim"]),
        rms_norm_eps=float(cfg["rms_norm_eps"]),
        max_position_embeddings=int(cfg["max_position_embeddings"]),
        pad_token_id=token(cfg["pad_token_id"]), bos_token_id=token(cfg["bos_token_id"]),
        eos_token_id=token(cfg["eos_token_id"]), tie_word_embeddings=True,
        attention_bias=False, attention_dropout=0.0,
    )
    layer_types = list(cfg["layer_types"])
    if family == "gemma":
        # Gemma 1 has fixed choices for everything our config makes variable; refuse anything else.
        # HF's GemmaConfig has no query_pre_attn_scalar: it always scales by head_dim**-0.5.
        fixed = {"query_pre_attn_scalar": float(cfg["head_dim"]), "attn_logit_softcapping": 0.0,
                 "final_logit_softcapping": 0.0, "sliding_window": 0,
                 "rope_local_theta": float(cfg["rope_theta"])}
        for key, want in fixed.items():
            if float(cfg[key]) != want:
                allowed = f"0 or head_dim ({want:g})" if key == "query_pre_attn_scalar" else f"{want:g}"
                raise ConversionError(f"family gemma needs {key} = {allowed}, got {cfg[key]:g} "
                                      "(Hugging Face's Gemma 1 has no such setting)")
        if any(t != "full_attention" for t in layer_types):
            raise ConversionError("family gemma has only full_attention layers")
        hf = transformers.GemmaConfig(hidden_act="gelu_pytorch_tanh",
                                      rope_parameters=rope(cfg["rope_theta"],
                                                           cfg["rope_scaling_factor"]), **common)
    else:
        scalar = float(cfg["query_pre_attn_scalar"])
        if not scalar.is_integer():  # HF's strict config declares it an int
            raise ConversionError(f"query_pre_attn_scalar {scalar} is not an integer")
        softcap = {k: (float(cfg[k]) or None)
                   for k in ("attn_logit_softcapping", "final_logit_softcapping")}
        extra = dict(hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=int(scalar),
                     sliding_window=int(cfg["sliding_window"]) or None, layer_types=layer_types,
                     **softcap, **common)
        if family == "gemma2":
            if float(cfg["rope_local_theta"]) != float(cfg["rope_theta"]):
                raise ConversionError("family gemma2 uses one rope theta for all layers")
            hf = transformers.Gemma2Config(
                rope_parameters=rope(cfg["rope_theta"], cfg["rope_scaling_factor"]), **extra)
        else:
            hf = transformers.Gemma3TextConfig(rope_parameters={
                "full_attention": rope(cfg["rope_theta"], cfg["rope_scaling_factor"]),
                "sliding_attention": rope(cfg["rope_local_theta"], 1.0)}, **extra)
    hf.architectures = [ARCHITECTURE_OF_FAMILY[family]]
    if dtype_name is not None:
        hf.dtype = dtype_name
    return hf


def config_yaml(cfg):
    ordered = {k: cfg[k] for k in CONFIG_KEYS}
    return yaml.safe_dump(ordered, sort_keys=False, default_flow_style=False)
