"""libNAME.a written here rather than by ar: GNU ar took 28 ms a call (it loads the LTO plugin first), over a tenth of
a small model's build, and the test suite builds thousands. One member, the model's relocatable object, after a
symbol index (the System V / GNU form every linker reads) listing the symbols it defines globally, read from its ELF
symbol table (ELF64 little-endian: x86-64 and aarch64; anything else goes to ar)."""

from __future__ import annotations

import struct
from pathlib import Path

ELF64_LE = b"\x7fELF\x02\x01"
SHT_SYMTAB = 2
STB_GLOBAL, STB_WEAK = 1, 2
SHN_UNDEF = 0


def global_symbols(obj: bytes) -> list[str] | None:
  """The names an ELF64 little-endian object defines globally (or weakly), None for any other object."""
  if not obj.startswith(ELF64_LE):
    return None
  shoff, shentsize, shnum = struct.unpack_from("<Q", obj, 0x28)[0], *struct.unpack_from("<HH", obj, 0x3A)
  sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
  names = []
  for _, kind, _, _, offset, size, link, _, _, entsize in sections:
    if kind != SHT_SYMTAB:
      continue
    strtab = sections[link][4]
    for at in range(offset, offset + size, entsize):
      name, info, _, shndx = struct.unpack_from("<IBBH", obj, at)
      if info >> 4 in (STB_GLOBAL, STB_WEAK) and shndx != SHN_UNDEF and name:
        names.append(obj[strtab + name : obj.index(b"\0", strtab + name)].decode())
  return names


def _header(name: str, size: int) -> bytes:
  # name/, mtime, uid, gid and mode as ar's deterministic mode (D) writes them: the archive's bytes depend on its member
  return f"{name:<16}{0:<12}{0:<6}{0:<6}{644:<8}{size:<10}`\n".encode()


def write_archive(obj_path: Path, out: Path) -> bool:
  """out: an archive of the one object at obj_path with its symbol index; False (nothing written) if the object is
  not one this reads."""
  obj = obj_path.read_bytes()
  symbols = global_symbols(obj)
  if symbols is None:
    return False
  names = b"".join(s.encode() + b"\0" for s in symbols)
  index_size = 4 + 4 * len(symbols) + len(names)
  index_size += index_size % 2
  member_at = 8 + 60 + index_size  # after the magic, the index's header and the index
  index = struct.pack(f">I{len(symbols)}I", len(symbols), *[member_at] * len(symbols)) + names
  member_name = obj_path.name[:15] + "/"
  parts = [b"!<arch>\n", _header("/", len(index)), index, b"\n" * (len(index) % 2)]
  parts += [_header(member_name, len(obj)), obj, b"\n" * (len(obj) % 2)]
  out.write_bytes(b"".join(parts))
  return True
