"""Walks the global heap collections of an HDF5 file before HDF5 reads a string attribute.

Variable-length strings (all our string attributes) live in global heap collections, the one part
of a 1.10 file without an HDF5 checksum. The 'checksums' attribute catches changed string bytes,
but only after HDF5 has decoded the collection, and HDF5 2.0 loops forever on a collection whose
object sizes were damaged (an object of size 0 never advances its walk). So each collection is
walked here first, the way HDF5 decodes it (H5HG cache deserialize), and a damaged one refused.
Collections are found by their signature in the bytes that no dataset's raw data occupies.
"""

import os

import h5py

SIGNATURE = b"GCOL\x01"  # magic and version 1
MIN_SIZE = 4096          # H5HG_MINSIZE


class HeapError(Exception):
    pass


def _data_ranges(h5):
    """(start, end) of every dataset's raw data: chunks, or contiguous storage."""
    ranges = []

    def visit(_, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        dsid = obj.id
        layout = dsid.get_create_plist().get_layout()
        if layout == h5py.h5d.CHUNKED:
            dsid.chunk_iter(lambda info: ranges.append((info.byte_offset, info.byte_offset + info.size)))
        elif layout == h5py.h5d.CONTIGUOUS and dsid.get_offset() is not None:
            ranges.append((dsid.get_offset(), dsid.get_offset() + dsid.get_storage_size()))

    h5.visititems(visit)
    return sorted(ranges)


def _walk(block, sizeof_size):
    """None when HDF5 would decode this collection and stop, else what is wrong with it."""
    header = 8 + sizeof_size
    size = int.from_bytes(block[8:header], "little")
    if size < MIN_SIZE or size > len(block):
        return f"collection size {size}"
    obj_header = 8 + sizeof_size
    p = header
    while p < size:
        if p + obj_header > size:
            break  # too small for an object: free space, as HDF5 takes it
        index = int.from_bytes(block[p:p + 2], "little")
        length = int.from_bytes(block[p + 8:p + 8 + sizeof_size], "little")
        need = obj_header + (length + 7) // 8 * 8 if index > 0 else length
        if need == 0 or p + need > size:
            return f"object {index} of {length} bytes at offset {p}"
        p += need
    return None


def check(h5, path):
    """Raises HeapError naming `path` when a global heap collection would not decode."""
    try:
        ranges = _data_ranges(h5)
        _, sizeof_size = h5.id.get_create_plist().get_sizes()
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        message = " ".join(str(e).split())
        what = "checksum mismatch in the file's HDF5 metadata" if "checksum" in message.lower() else "damaged HDF5 metadata"
        raise HeapError(f"{path}: {what} ({message})") from None
    end = os.path.getsize(path)
    gaps, at = [], 0
    for start, stop in ranges:
        if start > at:
            gaps.append((at, start))
        at = max(at, stop)
    gaps.append((at, end))
    with open(path, "rb") as fh:
        for start, stop in gaps:
            fh.seek(start)
            gap = fh.read(stop - start)
            found = gap.find(SIGNATURE)
            while found >= 0:
                problem = _walk(gap[found:], sizeof_size)
                if problem:
                    raise HeapError(f"{path}: damaged global heap (string attribute storage) at byte "
                                    f"{start + found}: {problem}")
                found = gap.find(SIGNATURE, found + 1)
