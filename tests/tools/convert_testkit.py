"""Helpers shared by the tests of tools/convert_hf_gemma.py: the converter module, the committed
fixtures, bit-exact tensor comparison, in-process command runs and edits of a converted file that
re-hash it (so the check an edit aims at is reached). Not a test itself (ctest only picks up
tests/tools/test_*.py)."""

import contextlib
import io
import os
import sys

import h5py
import numpy as np
import torch
import yaml

SOURCE_DIR = os.environ.get("DARKFORMER_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools"))
import convert_hf_gemma as conv  # noqa: E402
from h5_checksums import rehash, text_bytes  # noqa: E402

FIXTURES = os.path.join(SOURCE_DIR, "tests", "fixtures")

def quiet(fn, *args):
    """Runs fn with its stdout/stderr captured; returns (result, captured text)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        result = fn(*args)
    return result, buf.getvalue()


def bits(t):
    # Bit patterns, so that -0.0 vs 0.0 and NaN payloads count as differences.
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


def same_tensors(a, b):
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(bits(a[k]), bits(b[k]))
        for k in a)


def attr(obj, name):
    """A string attribute as str (ours are fixed-length, which h5py returns as bytes), else as is."""
    value = obj.attrs[name]
    return text_bytes(value).decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else value


def run_cli(args):
    """conv.main in-process: (exit code, stderr lines). Stdout is captured and dropped."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = conv.main(args)
    return rc, err.getvalue().splitlines()


def fresh_h5(name, path):
    """to-h5 of fixture `name` written to `path`."""
    rc, _ = run_cli(["to-h5", os.path.join(FIXTURES, name), path])
    assert rc == 0, f"to-h5 of {name} failed"
    return path


def set_config(path, **changes):
    with h5py.File(path, "a") as h5:
        cfg = yaml.safe_load(attr(h5, "config_yaml"))
        cfg.update(changes)
        h5.attrs["config_yaml"] = yaml.safe_dump(cfg, sort_keys=False)
        rehash(h5)


def add_dataset(h5, name, array, dtype_attr):
    if name in h5:
        del h5[name]
    h5.create_dataset(name, data=array)
    h5[name].attrs["dtype"] = dtype_attr
    rehash(h5)


def one_error_line(rc, lines):
    return rc == 2 and len(lines) == 1 and lines[0].startswith("error: ")
