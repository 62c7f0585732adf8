"""Checks the config.json fields that convert_hf_gemma.py maps to our config, before transformers
reads the file: transformers rejects some wrong types with a traceback of its own, and fills a
missing field with its class default, which for a size or a RoPE base frequency is a guess that
changes the model. So every field the mapping uses must be present and of its JSON type.

One exception, the text_config of a multimodal Gemma 3 checkpoint (model_type "gemma3"): before
transformers 5 it was saved as its difference to Gemma3TextConfig's defaults, and Google's own
configs rely on that (gemma-3-4b-it's text_config names only hidden_size, intermediate_size,
num_hidden_layers, rope_scaling and sliding_window). There an absent field means the value of
TEXT_CONFIG_DEFAULTS (Gemma3TextConfig documents itself as google/gemma-3-4b-it), and
check_defaults() makes sure the transformers at hand gives exactly that value.
"""

import json
import math

INTEGERS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings")
FAMILY_OF_MODEL_TYPE = {"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3"}
# Gemma 3's published values of the text_config fields its multimodal configs may omit.
TEXT_CONFIG_DEFAULTS = {
    "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
}
# Where Gemma 3 keeps each layer type's base frequency, and its older top-level name.
GEMMA3_THETAS = (("full_attention", "rope_theta"), ("sliding_attention", "rope_local_base_freq"))


class ConfigFieldError(Exception):
    pass


def _kind_error(value, kind):
    """None when `value` is a `kind` ("integer", "positive number", ...), else what it must be."""
    if isinstance(value, bool):  # JSON true/false: Python counts them as ints
        return "an integer" if kind.endswith("integer") else "a finite number"
    if kind.endswith("integer") and not isinstance(value, int):
        return "an integer"
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "a finite number"
    sign = kind.split()[0]
    if (sign == "positive" and value <= 0) or (sign == "non-negative" and value < 0):
        return "a " + kind
    return None


class _Fields:
    def __init__(self, cfg, prefix, where, defaults):
        self.cfg, self.prefix, self.where, self.defaults = cfg, prefix, where, defaults
        self.defaulted = []

    def fail(self, name, what):
        raise ConfigFieldError(f"{self.where}: field '{self.prefix}{name}' {what}")

    def value(self, name, kind, value):
        problem = _kind_error(value, kind)
        if problem:
            self.fail(name, f"must be {problem}, got {value!r}")

    def field(self, name, kind, required=True, nullable=False):
        if name not in self.cfg:
            if name in self.defaults:
                self.defaulted.append(name)
            elif required:
                self.fail(name, "is missing (transformers would silently put in its default)")
        elif not (nullable and self.cfg[name] is None):
            self.value(name, kind, self.cfg[name])

    def mapping(self, name, value):
        if value is not None and not isinstance(value, dict):
            self.fail(name, f"must be an object, got {value!r}")
        return value or {}

    def rope(self, name, rope):
        """The theta and factor of one rope dict, where given; True when it holds a theta."""
        if "factor" in rope:
            self.value(f"{name}.factor", "positive number", rope["factor"])
        if "rope_theta" in rope:
            self.value(f"{name}.rope_theta", "positive number", rope["rope_theta"])
        return "rope_theta" in rope

    def thetas(self, family):
        cfg = self.cfg
        # transformers reads the theta from the rope dict first, then the top-level key.
        if family == "gemma3":  # a legacy rope_scaling updates the full_attention dict there
            rope = self.mapping("rope_parameters", cfg.get("rope_parameters"))
            scaling = self.mapping("rope_scaling", cfg.get("rope_scaling"))
            self.rope("rope_scaling", scaling)
            pairs = [(f"rope_parameters.{t}", dict(self.mapping(f"rope_parameters.{t}", rope.get(t)),
                                                   **(scaling if t == "full_attention" else {})), legacy)
                     for t, legacy in GEMMA3_THETAS]
        else:  # a legacy rope_scaling replaces rope_parameters there
            name = "rope_scaling" if cfg.get("rope_scaling") else "rope_parameters"
            pairs = [(name, self.mapping(name, cfg.get(name)), "rope_theta")]
        for name, rope, legacy in pairs:
            if self.rope(name, rope):
                continue
            if legacy in cfg or legacy not in self.defaults:
                if legacy not in cfg:
                    self.fail(legacy, f"is missing, as is '{self.prefix}{name}.rope_theta': transformers would "
                                      "silently put in a default RoPE base frequency")
                self.value(legacy, "positive number", cfg[legacy])
            else:
                self.defaulted.append(legacy)


def check(config_json):
    """Reads and checks config.json. Returns the names of the fields taken from
    TEXT_CONFIG_DEFAULTS (only a multimodal Gemma 3 text_config may omit any)."""
    try:
        with open(config_json, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError) as e:
        raise ConfigFieldError(f"{config_json}: not readable JSON ({' '.join(str(e).split())})") from None
    if not isinstance(cfg, dict):
        raise ConfigFieldError(f"{config_json}: not a JSON object")
    prefix, defaults, model_type = "", {}, cfg.get("model_type")
    if model_type == "gemma3":
        cfg = _Fields(cfg, "", config_json, {}).mapping("text_config", cfg.get("text_config"))
        prefix, defaults, model_type = "text_config.", TEXT_CONFIG_DEFAULTS, cfg.get("model_type", "gemma3_text")
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None:
        return []  # the mapping refuses the model type, naming it
    fields = _Fields(cfg, prefix, config_json, defaults)
    for name in INTEGERS:
        fields.field(name, "positive integer")
    fields.field("rms_norm_eps", "positive number")
    if family != "gemma":  # Gemma 1 has neither setting
        fields.field("query_pre_attn_scalar", "non-negative integer")
        fields.field("sliding_window", "non-negative integer", nullable=True)
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        fields.field(name, "non-negative number", required=False, nullable=True)
    fields.thetas(family)
    return fields.defaulted


def _hf_value(text_config, name):
    rope = getattr(text_config, "rope_parameters", None) or {}
    for layer_type, legacy in GEMMA3_THETAS:
        if name == legacy:
            return (rope.get(layer_type) or {}).get("rope_theta")
    return getattr(text_config, name, None)


def check_defaults(hf_config, defaulted, config_json):
    """After transformers loaded the config: each defaulted field holds Gemma 3's value. Returns
    the note to print (None when nothing was defaulted)."""
    if not defaulted:
        return None
    text = hf_config.text_config
    for name in defaulted:
        got, want = _hf_value(text, name), TEXT_CONFIG_DEFAULTS[name]
        if got != want:
            raise ConfigFieldError(f"{config_json}: field 'text_config.{name}' is absent and this transformers "
                                   f"defaults it to {got!r}, not Gemma 3's {want!r}: give it in config.json")
    return (f"note: {config_json}: text_config omits {', '.join(defaulted)}: Gemma 3's values used (older "
            "transformers saved text_config as its difference to those defaults)")
