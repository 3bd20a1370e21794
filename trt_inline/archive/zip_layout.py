"""One view of a zip archive: refuse any layout that two readers could see differently.

Python's ``zipfile`` (which the safety checks read) and torch's reader (which
loads the file) find entries in different ways: ``zipfile`` infers "prepended
data" from where the end record sits and takes the last of two entries with
the same name, torch's reader follows the central directory offset the end
record declares and takes the first. A file can be built so that the bytes
checked are not the bytes loaded. :func:`check_layout` therefore accepts only
archives in which every reader must agree:

* one end record, ending exactly at the end of the file, and (zip64) its locator
  and record where they must be;
* the central directory exactly where the end record says, ending exactly where
  the end record (or the zip64 record) starts, holding as many entries as declared;
* no two entries whose names are equal once ASCII letters are folded to lower
  case (torch's reader, miniz, finds ``DATA.PKL`` when asked for ``data.pkl``),
  no encrypted entry (:func:`refuse_compressed` refuses compressed ones too,
  once an archive is known to be torch's: torch writes uncompressed, and so a
  file cannot expand beyond its size);
* local headers that agree with the directory (name, method, sizes), the first
  at offset 0, each entry's data (and data descriptor) followed directly by the
  next local header, the last by the central directory: no bytes anywhere that
  no entry owns.

Only headers are read, never entry data, so the check costs the same for any size.
The archive is read through a :class:`Readable` (a mapped file, or bytes), so that an
archive nested inside another (``torch.save`` blobs) is checked the same way,
at its offset in the outer file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from trt_inline.errors import UnsafeArchiveError, printable

__all__ = ["Readable", "ZipEntry", "check_layout", "folded", "refuse_compressed"]


class Readable(Protocol):
    """Bytes ``[0, size)`` of an archive, read at offsets."""

    @property
    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


def folded(name: str) -> str:
    """A name as torch's zip reader compares it: ASCII letters in lower case."""
    return name.translate(_LOWER)


_LOWER = {code: code + 32 for code in range(ord("A"), ord("Z") + 1)}

_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
_DESCRIPTOR = b"PK\x07\x08"
_MAX_COMMENT = 0xFFFF
_U16 = 0xFFFF
_U32 = 0xFFFFFFFF


@dataclass(frozen=True)
class ZipEntry:
    name: str
    offset: int  # of the local header
    data_offset: int
    compress_size: int
    file_size: int
    method: int


def refuse_compressed(entries: list[ZipEntry], where: str) -> None:
    """Refuse a compressed entry: torch writes its archives uncompressed (and so nothing expands past its size)."""
    for entry in entries:
        if entry.method != 0:
            raise UnsafeArchiveError(
                f"{where}: refused: entry {printable(entry.name)!r} is compressed (torch writes its archives "
                "uncompressed)"
            )


def check_layout(view: Readable, where: str) -> list[ZipEntry]:
    """The entries of the zip archive in ``view``, or :class:`UnsafeArchiveError` naming ``where``."""
    reader = _Reader(view, where)
    cd_offset, cd_size, count, cd_end = reader.end_records()
    entries = reader.central_directory(cd_offset, cd_size, count)
    if cd_offset + cd_size != cd_end:
        reader.refuse("its central directory does not end where the end record starts (bytes between them)")
    by_folded: dict[str, str] = {}  # each name without case -> the name (a dict: an archive of many entries)
    for entry in entries:
        other = by_folded.get(folded(entry.name))
        if other == entry.name:
            reader.refuse(f"two entries are named {printable(entry.name)!r}")
        if other is not None:
            reader.refuse(
                f"entries {printable(other)!r} and {printable(entry.name)!r} differ only in case, and torch's "
                "reader matches names without case"
            )
        by_folded[folded(entry.name)] = entry.name
    position = 0
    for entry in sorted(entries, key=lambda e: e.offset):
        if entry.offset != position:
            reader.refuse(f"bytes {position}..{entry.offset} belong to no entry (before {printable(entry.name)!r})")
        position = reader.local_entry(entry)
    if position != cd_offset:
        reader.refuse(f"bytes {position}..{cd_offset} belong to no entry (before the central directory)")
    return [reader.located(entry) for entry in entries]


@dataclass(frozen=True)
class _Central:
    name: str
    raw_name: bytes
    flags: int
    method: int
    crc: int
    compress_size: int
    file_size: int
    offset: int


class _Reader:
    def __init__(self, view: Readable, where: str) -> None:
        self.view = view
        self.size = view.size
        self.where = where
        self.data_offsets: dict[int, int] = {}

    def refuse(self, why: str) -> NoReturn:
        raise UnsafeArchiveError(f"{self.where}: refused: {why}; zip readers could see different files in it")

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > self.size:
            self.refuse(f"a header at {offset} runs past the end of the archive")
        data = self.view.read(offset, length)
        if len(data) != length:
            self.refuse(f"a header at {offset} runs past the end of the archive")
        return data

    def end_records(self) -> tuple[int, int, int, int]:
        """(central directory offset, its size, entry count, where the end records start)."""
        tail_start = max(0, self.size - _MAX_COMMENT - 22)
        tail = self.read(tail_start, self.size - tail_start)
        position = tail.rfind(_EOCD)
        if position < 0 or len(tail) - position < 22:
            self.refuse("no end-of-archive record")
        (_, disk, cd_disk, disk_count, count, cd_size, cd_offset, comment) = struct.unpack(
            "<4sHHHHIIH", tail[position : position + 22]
        )
        eocd = tail_start + position
        if eocd + 22 + comment != self.size:
            self.refuse("its end record does not end at the end of the file")
        if _EOCD in tail[position + 22 :]:
            self.refuse("its comment holds another end record")
        if disk or cd_disk or disk_count != count:
            self.refuse("it spans several disks")
        saturated = count == _U16 or _U32 in (cd_size, cd_offset)
        locator = self.read(eocd - 20, 20) if eocd >= 20 else b""
        if locator[:4] != _ZIP64_LOCATOR:
            if saturated:
                self.refuse("its end record needs a zip64 record, and there is none")
            return cd_offset, cd_size, count, eocd
        # zip64 (torch writes one always): the locator sits just before the end record and names the record.
        _, _, record_offset, _ = struct.unpack("<4sIQI", locator)
        record = self.read(record_offset, 56)
        fields = struct.unpack("<4sQHHIIQQQQ", record)
        if fields[0] != _ZIP64_EOCD or record_offset + 12 + fields[1] != eocd - 20:
            self.refuse("its zip64 end record is not directly before its locator")
        count64, cd_size64, cd_offset64 = fields[7], fields[8], fields[9]
        if not saturated and (count64, cd_size64, cd_offset64) != (count, cd_size, cd_offset):
            self.refuse("its end record and its zip64 end record disagree")
        return cd_offset64, cd_size64, count64, record_offset

    def central_directory(self, offset: int, size: int, count: int) -> list[_Central]:
        data = self.read(offset, size)
        entries: list[_Central] = []
        position = 0
        while position < len(data):
            if data[position : position + 4] != _CENTRAL or position + 46 > len(data):
                self.refuse(f"its central directory has unreadable bytes at {offset + position}")
            fields = struct.unpack("<4sHHHHHHIIIHHHHHII", data[position : position + 46])
            flags, method, crc, compress_size, file_size = fields[3], fields[4], fields[7], fields[8], fields[9]
            name_length, extra_length, comment_length, local_offset = fields[10], fields[11], fields[12], fields[16]
            end = position + 46 + name_length + extra_length + comment_length
            if end > len(data):
                self.refuse("its central directory runs past its declared size")
            raw_name = data[position + 46 : position + 46 + name_length]
            extra = data[position + 46 + name_length : position + 46 + name_length + extra_length]
            file_size, compress_size, local_offset = _zip64_values(extra, file_size, compress_size, local_offset)
            if flags & 0x1:
                self.refuse(f"entry {_decode(raw_name, flags)!r} is encrypted")
            entries.append(
                _Central(_decode(raw_name, flags), raw_name, flags, method, crc, compress_size, file_size, local_offset)
            )
            position = end
        if len(entries) != count:
            self.refuse(f"its end record declares {count} entries, its central directory holds {len(entries)}")
        return entries

    def local_entry(self, entry: _Central) -> int:
        """Check an entry's local header against the directory; the offset just past its data."""
        header = self.read(entry.offset, 30)
        fields: tuple[Any, ...] = struct.unpack("<4sHHHHHIIIHH", header)
        signature, flags, method, crc, compress_size, file_size = (
            fields[0],
            fields[2],
            fields[3],
            fields[6],
            fields[7],
            fields[8],
        )
        name_length: int = fields[9]
        extra_length: int = fields[10]
        name = printable(entry.name)
        if signature != _LOCAL:
            self.refuse(f"the directory points entry {name!r} at something other than a local header")
        if self.read(entry.offset + 30, name_length) != entry.raw_name:
            self.refuse(f"entry {name!r} has another name in its local header")
        if method != entry.method or (flags ^ entry.flags) & 0x9:
            self.refuse(f"entry {name!r} is stored differently in its local header and the directory")
        extra = self.read(entry.offset + 30 + name_length, extra_length)
        data_offset = entry.offset + 30 + name_length + extra_length
        self.data_offsets[entry.offset] = data_offset
        end = data_offset + entry.compress_size
        if end > self.size:
            self.refuse(f"entry {name!r} runs past the end of the archive")
        if flags & 0x8:
            return self._descriptor(entry, end)
        local_sizes = _zip64_values(extra, file_size, compress_size, 0)[:2]
        if crc != entry.crc or local_sizes != (entry.file_size, entry.compress_size):
            self.refuse(f"entry {name!r} declares other sizes in its local header than in the directory")
        return end

    def _descriptor(self, entry: _Central, end: int) -> int:
        """The data descriptor after an entry's data (optional signature; 32- or 64-bit sizes) must agree too."""
        name = printable(entry.name)
        for signature in (True, False):
            for wide in (False, True):
                length = (4 if signature else 0) + 4 + (16 if wide else 8)
                if end + length > self.size:
                    continue
                data = self.read(end, length)
                if signature and data[:4] != _DESCRIPTOR:
                    continue
                body = data[4:] if signature else data
                values: tuple[int, int, int] = struct.unpack("<IQQ" if wide else "<III", body)
                if values == (entry.crc, entry.compress_size, entry.file_size):
                    return end + length
        self.refuse(f"entry {name!r} has a data descriptor that disagrees with the directory")

    def located(self, entry: _Central) -> ZipEntry:
        return ZipEntry(
            entry.name,
            entry.offset,
            self.data_offsets[entry.offset],
            entry.compress_size,
            entry.file_size,
            entry.method,
        )


def _zip64_values(extra: bytes, file_size: int, compress_size: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset with the zip64 extra field's values where the 32-bit fields say "see zip64"."""
    position = 0
    while position + 4 <= len(extra):
        tag, length = struct.unpack("<HH", extra[position : position + 4])
        body = extra[position + 4 : position + 4 + length]
        if tag == 0x0001:
            values = [int.from_bytes(body[i : i + 8], "little") for i in range(0, len(body) - 7, 8)]
            if file_size == _U32 and values:
                file_size = values.pop(0)
            if compress_size == _U32 and values:
                compress_size = values.pop(0)
            if offset == _U32 and values:
                offset = values.pop(0)
        position += 4 + length
    return file_size, compress_size, offset


def _decode(raw: bytes, flags: int) -> str:
    return raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")
