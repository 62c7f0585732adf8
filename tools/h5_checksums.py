"""The checksummed layout of darkformer's HDF5 files, written and checked the way the C++ does it
(src/model/h5_checksums.h), for convert_hf_gemma.py:
  - every dataset with dimensions and elements is chunked (at most CHUNK_BYTES a chunk) with the
    Fletcher32 filter, which HDF5 verifies on every read; scalars and empty ones are compact (their
    bytes sit in their checksummed object header);
  - the file is in the 1.10 format, whose superblock, object headers and chunk indexes carry HDF5's
    own checksums;
  - string attributes are fixed-length UTF-8, so they sit in those checksummed object headers,
    never in HDF5's global heap (no checksum there, and HDF5 loops forever on a damaged one); the
    root attribute `checksums` also holds an FNV-1a 64 hash of each, one line
    "<16 hex digits> <key>" per attribute (key: the name for the root's own, "object@name" for a
    dataset's or group's).
Files written before this have none of it and still convert, with a note (UNVERIFIED).
"""

import h5py
import numpy as np
import torch

import h5_heap_check

CHUNK_BYTES = 16 << 20
CHECKSUMS = "checksums"
LIBVER = ("v110", "v110")
UNVERIFIED = "carries no checksums (written before they were added); read unverified"
_FNV_OFFSET, _FNV_PRIME, _MASK = 14695981039346656037, 1099511628211, (1 << 64) - 1


class IntegrityError(Exception):
    """A file whose bytes are not what was written, or a tensor that no model should hold."""


def fnv1a64(data):
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def text_bytes(value):
    """The stored bytes of a string attribute as h5py returns it (str decoded with surrogateescape
    for invalid UTF-8, or bytes for fixed-length strings)."""
    return bytes(value) if isinstance(value, (bytes, np.bytes_)) else value.encode("utf-8", "surrogateescape")


def is_text(value):
    return isinstance(value, (str, bytes, np.bytes_))


def chunk_dims(shape, element_bytes):
    """Whole trailing dimensions and as many leading rows as fit in CHUNK_BYTES, splitting further
    dimensions only when one row alone is larger (C++ ChunkDims)."""
    chunk = list(shape)
    for d in range(len(chunk)):
        inner = element_bytes * int(np.prod(chunk[d + 1:], dtype=np.int64))
        fit = max(1, CHUNK_BYTES // max(inner, 1))
        if chunk[d] <= fit:
            break
        chunk[d] = fit
        if fit > 1 or inner <= CHUNK_BYTES:
            break
    return tuple(max(int(c), 1) for c in chunk)


def attribute_key(object_name, name):
    object_name = object_name.strip("/")
    return f"{object_name}@{name}" if object_name else name


def format_checksums(hashes):
    # Sorted by bytes, as std::map<std::string> orders them.
    return "".join(f"{h:016x} {key}\n" for key, h in sorted(hashes.items(), key=lambda kv: kv[0].encode()))


def parse_checksums(text, path):
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    hashes = {}
    for line in lines:
        head = line[:16]
        if len(line) <= 17 or line[16] != " " or not all(c in "0123456789abcdefABCDEF" for c in head):
            raise IntegrityError(f"{path}: unreadable '{CHECKSUMS}' attribute")
        hashes[line[17:]] = int(head, 16)
    return hashes


def check_finite(tensor, path, name):
    """Refuses NaN and Inf, counting them; checked in slices so no full-size mask is made."""
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return
    flat = tensor.reshape(-1)
    step = 1 << 24
    if all(bool(torch.isfinite(flat[i:i + step]).all()) for i in range(0, flat.numel(), step)):
        return
    nan = sum(int(torch.isnan(flat[i:i + step]).sum()) for i in range(0, flat.numel(), step))
    inf = sum(int(torch.isinf(flat[i:i + step]).sum()) for i in range(0, flat.numel(), step))
    raise IntegrityError(f"{path}: tensor '{name}' holds non-finite values ({nan} NaN, {inf} Inf of {flat.numel()})")


def set_string(obj, name, value):
    """A fixed-length UTF-8 string attribute (in the object header), as the C++ writes them."""
    encoded = value.encode("utf-8")
    obj.attrs.create(name, np.array(encoded, dtype=h5py.string_dtype("utf-8", max(len(encoded), 1))))


def rehash(h5):
    """Recomputes the root `checksums` from the file's current string attributes: for tests and
    tools that edit a file on purpose."""
    hashes = {}

    def collect(obj):
        for name, value in obj.attrs.items():
            if is_text(value) and not (obj.name == "/" and name == CHECKSUMS):
                hashes[attribute_key(obj.name, name)] = fnv1a64(text_bytes(value))

    collect(h5)
    h5.visititems(lambda _, obj: collect(obj))
    set_string(h5, CHECKSUMS, format_checksums(hashes))


class Writer:
    """Datasets and string attributes written into an h5py file opened with libver=LIBVER,
    hashing each string attribute; finish() stores the hashes."""

    def __init__(self, h5):
        self.h5, self.hashes = h5, {}

    def string_attr(self, obj, name, value):
        set_string(obj, name, value)
        self.hashes[attribute_key(obj.name, name)] = fnv1a64(value.encode("utf-8"))

    def dataset(self, name, array, dtype_name):
        if array.ndim and array.size:
            ds = self.h5.create_dataset(name, data=array, chunks=chunk_dims(array.shape, array.itemsize),
                                        fletcher32=True)
        else:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            ds = self.h5.create_dataset(name, data=array, dcpl=dcpl)
        self.string_attr(ds, "dtype", dtype_name)

    def finish(self):
        set_string(self.h5, CHECKSUMS, format_checksums(self.hashes))


def _hdf5_message(error):
    return " ".join(str(error).split())


class Reader:
    """Objects, string attributes and tensors of an open file, each checked against the file's
    checksums as it is read; errors name the file and the object."""

    def __init__(self, h5, path):
        self.h5, self.path = h5, path
        try:
            h5_heap_check.check(h5, path)  # before HDF5 decodes any string attribute
        except h5_heap_check.HeapError as e:
            raise IntegrityError(str(e)) from None
        text = self.attr(h5, CHECKSUMS)
        if text is not None and not is_text(text):
            raise IntegrityError(f"{path}: unreadable '{CHECKSUMS}' attribute")
        self.hashes = None if text is None else parse_checksums(text_bytes(text).decode("utf-8", "replace"), path)

    @property
    def verified(self):
        return self.hashes is not None

    def attr(self, obj, name):
        """An attribute's value as h5py gives it (unverified), or None when absent."""
        key = attribute_key(obj.name, name)
        try:
            return obj.attrs[name] if name in obj.attrs else None
        except (OSError, KeyError, RuntimeError, ValueError) as e:
            raise IntegrityError(f"{self.path}: cannot read attribute '{key}' ({_hdf5_message(e)})") from None

    def string_attr(self, obj, name):
        """The attribute's value (str for a string, verified), or None when absent."""
        value = self.attr(obj, name)
        if value is None or not is_text(value):
            return value
        raw = text_bytes(value)
        if self.hashes is not None:
            key = attribute_key(obj.name, name)
            if key not in self.hashes:
                raise IntegrityError(f"{self.path}: attribute '{key}' has no checksum in the file's '{CHECKSUMS}' attribute")
            if self.hashes[key] != fnv1a64(raw):
                raise IntegrityError(f"{self.path}: checksum mismatch in attribute '{key}'")
        return raw.decode("utf-8", "surrogateescape")

    def _failed(self, name, error):
        message = _hdf5_message(error)
        # Fletcher32 reports itself as a failed filter; metadata checks name the checksum.
        if "checksum" in message.lower() or "filter returned failure" in message:
            return IntegrityError(f"{self.path}: checksum mismatch in tensor '{name}'")
        return IntegrityError(f"{self.path}: cannot read tensor '{name}' ({message})")

    def names(self):
        try:
            return list(self.h5.keys())
        except (OSError, KeyError, RuntimeError, ValueError) as e:
            raise IntegrityError(f"{self.path}: cannot list the file's objects ({_hdf5_message(e)})") from None

    def get(self, name):
        try:
            return self.h5[name]
        except (OSError, KeyError, RuntimeError, ValueError) as e:
            raise self._failed(name, e) from None

    def read(self, ds, name):
        try:
            return ds[()]
        except (OSError, KeyError, RuntimeError, ValueError) as e:
            raise self._failed(name, e) from None
