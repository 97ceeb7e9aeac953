"""PyTorch state dicts (`torch.save(module.state_dict(), path)`) read into NumPy arrays, without torch.

A state dict is a pickled dict of tensor names to tensors, each tensor a view (offset, size, stride) of
a storage whose bytes lie outside the pickle. `torch.save` writes one of two containers:

- the zip format (PyTorch 1.6 and later by default): `<name>/data.pkl` holds the pickle, and each storage
  is the raw bytes of `<name>/data/<key>`;
- the legacy format (before 1.6, and `_use_new_zipfile_serialization=False`; ELMoForManyLangs' released
  models, 2018): five pickles one after another (a magic number, the protocol version, the writer's
  system info, the object, the list of storage keys), then each storage in that order as an int64
  element count and its raw bytes.

Unpickling runs code a file names, so the unpickler here resolves only what a state dict of tensors
needs: the dict classes, torch's tensor rebuild functions and its typed storage classes, mapped to
stand-ins that build NumPy arrays. Anything else (a whole pickled module, an optimiser, a function) is
refused with the name the file asked for, before any of its code could run. Little-endian storages only
(every platform PyTorch ships for).
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001

# torch's typed storage classes -> the NumPy dtype of their elements (bfloat16 has none in NumPy).
STORAGE_DTYPES = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


class NotAStateDict(ValueError):
    """The file is not a pickled state dict of tensors (or not one this reader can take)."""


class _StorageType:
    """Stands for a torch storage class (`torch.FloatStorage`) in a pickle."""

    def __init__(self, name: str):
        self.name, self.dtype = name, np.dtype(STORAGE_DTYPES[name])


class _Storage:
    """A storage: its dtype and element count, its bytes once read."""

    def __init__(self, dtype: np.dtype, numel: int):
        self.dtype, self.numel, self.data = dtype, int(numel), None


class _Tensor:
    """A tensor to build once its storage's bytes are read: (storage, offset, size, stride) in elements."""

    def __init__(self, storage, offset, size, stride):
        if not isinstance(storage, _Storage):
            raise NotAStateDict(f"a tensor's storage is a {type(storage).__name__}")
        self.storage, self.offset, self.size, self.stride = storage, int(offset), tuple(size), tuple(stride)

    def array(self) -> np.ndarray:
        data = self.storage.data
        if not self.size:
            return data[self.offset : self.offset + 1].reshape(()).copy()
        last = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride))
        if min(self.size) > 0 and (self.offset < 0 or last >= len(data) or min(self.stride) < 0):
            raise NotAStateDict(f"a tensor of size {self.size} reads past its storage of {len(data)} elements")
        item = data.itemsize
        view = np.lib.stride_tricks.as_strided(
            data[self.offset :], shape=self.size, strides=tuple(s * item for s in self.stride), writeable=False
        )
        return np.array(view)


def _rebuild_tensor(storage, storage_offset, size, stride, *_):
    return _Tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, *_):
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Resolves only `_ALLOWED` and torch's storage classes; `storages` collects the storages by key."""

    def __init__(self, file, storages: dict | None = None):
        super().__init__(file, encoding="utf-8")
        self.storages = storages if storages is not None else {}

    def find_class(self, module: str, name: str):
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        found = _ALLOWED.get((module, name))
        if found is None:
            raise NotAStateDict(f"it pickles {module}.{name}, which a state dict of tensors does not hold")
        return found

    def persistent_load(self, saved_id):
        if not isinstance(saved_id, tuple) or not saved_id or saved_id[0] not in ("storage", b"storage"):
            raise NotAStateDict(f"unknown persistent id {saved_id!r:.80}")
        storage_type, key, _location, numel = saved_id[1:5]
        if not isinstance(storage_type, _StorageType):
            raise NotAStateDict(f"a storage of type {storage_type!r:.60}")
        key = key.decode() if isinstance(key, bytes) else str(key)
        storage = self.storages.setdefault(key, _Storage(storage_type.dtype, numel))
        view = saved_id[5] if len(saved_id) > 5 else None
        if view is None:
            return storage
        view_key, offset, view_size = view  # the legacy format's view of a storage
        return _View(storage, int(offset), int(view_size))


class _View(_Storage):
    """A part of a storage (the legacy format's `view_metadata`)."""

    def __init__(self, root: _Storage, offset: int, numel: int):
        super().__init__(root.dtype, numel)
        self.root, self.start = root, offset

    @property
    def data(self):
        return None if self.root.data is None else self.root.data[self.start : self.start + self.numel]

    @data.setter
    def data(self, value):
        pass


def read_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a `torch.save`d state dict, as NumPy arrays keyed by name (see the module doc).

    Raises:
      FileNotFoundError: no such file.
      ValueError: the file is neither of torch.save's formats, is damaged, or holds anything but a dict of
        tensors; the message names the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: file not found")
    try:
        state = _read_zip(path) if zipfile.is_zipfile(path) else _read_legacy(path)
        return _arrays(state)
    except NotAStateDict as e:
        raise ValueError(f"{path}: not a PyTorch state dict of tensors: {e}") from None
    except (pickle.UnpicklingError, EOFError, struct.error, KeyError, TypeError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: cannot read it as a file of torch.save ({type(e).__name__}: {e})") from None


def _read_zip(path: str):
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise NotAStateDict("a zip archive without exactly one <name>/data.pkl")
        prefix = pickles[0][: -len("data.pkl")]
        if f"{prefix}byteorder" in names and archive.read(f"{prefix}byteorder") != b"little":
            raise NotAStateDict("its tensors are big-endian")
        unpickler = _Unpickler(io.BytesIO(archive.read(pickles[0])))
        state = unpickler.load()
        for key, storage in unpickler.storages.items():
            raw = archive.read(f"{prefix}data/{key}")
            storage.data = _storage_array(raw, storage, key)
    return state


def _read_legacy(path: str):
    with open(path, "rb") as f:
        header = [_Unpickler(f).load() for _ in range(3)]  # magic number, protocol version, system info
        if header[0] != LEGACY_MAGIC or header[1] != LEGACY_PROTOCOL:
            raise NotAStateDict("neither torch.save's zip format nor its legacy one (no magic number)")
        if isinstance(header[2], dict) and header[2].get("little_endian") is False:
            raise NotAStateDict("its tensors are big-endian")
        unpickler = _Unpickler(f)
        state = unpickler.load()
        keys = _Unpickler(f).load()
        if not isinstance(keys, list):
            raise NotAStateDict("no list of storage keys after the object")
        for key in keys:
            storage = unpickler.storages.get(str(key))
            if storage is None:
                raise NotAStateDict(f"storage {key!r} is listed but no tensor uses it")
            (numel,) = struct.unpack("<q", f.read(8))
            if numel != storage.numel:
                raise NotAStateDict(f"storage {key!r} holds {numel} elements where its tensors say {storage.numel}")
            storage.data = _storage_array(f.read(numel * storage.dtype.itemsize), storage, key)
    return state


def _storage_array(raw: bytes, storage: _Storage, key: str) -> np.ndarray:
    expected = storage.numel * storage.dtype.itemsize
    if len(raw) != expected:
        raise NotAStateDict(f"storage {key!r} has {len(raw)} bytes, expected {expected} (a truncated file?)")
    return np.frombuffer(raw, dtype=storage.dtype.newbyteorder("<"))


def _arrays(state) -> dict[str, np.ndarray]:
    if not isinstance(state, dict):
        raise NotAStateDict(f"it holds a {type(state).__name__}, not a dict of tensors")
    out = {}
    for name, tensor in state.items():
        if not isinstance(name, str) or not isinstance(tensor, _Tensor):
            raise NotAStateDict(f"entry {name!r:.60} is a {type(tensor).__name__}, not a tensor")
        out[name] = tensor.array()
    return out
