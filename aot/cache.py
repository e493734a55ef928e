"""The build cache: compiled objects and libraries kept by the hash of what made them, so a recompile of an unchanged
model (or of the runtime every model shares) does not run the C compiler again. It is capped: after a build that
stored something, the least recently used files go until the cache is under its cap."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

# the cap when AOT_CACHE_MAX_MB does not say: a zoo model's library and objects are 2-10 MB, the runtime's objects
# for one compiler and CPU ~3 MB, so this holds a few hundred models' builds and stays small beside a disk
DEFAULT_MAX_MB = 1024
# a file bigger than this share of the cap is not kept: storing it would evict most of what is there (a VGG-19's
# 0.6 GB library under the default cap took the runtime's objects and every other build with it, each time it was built)
KEEP_MAX_SHARE = 0.25
# a trim goes below the cap by this share, so the build after it does not trim again at once
TRIM_TO = 0.8
# a trim walks the whole cache (40 ms at 3,700 files: the test suite's cache, trimmed after each of its thousands of
# builds) only when the last walk's total and what this process stored since may be over the cap, or when the last
# walk is this old (other processes store too)
WALK_EVERY_S = 30.0
# per cache folder and cap: (total bytes at this process's last walk, when, bytes this process stored since)
_walked: dict[tuple[str, int], list] = {}


def cache_dir() -> Path:
  """AOT_CACHE_DIR, else $XDG_CACHE_HOME/aot-compiler, else ~/.cache/aot-compiler."""
  if d := os.environ.get("AOT_CACHE_DIR"):
    return Path(d)
  return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aot-compiler"


def max_bytes() -> int:
  """The cap: AOT_CACHE_MAX_MB megabytes (0: no cache kept past the build), else DEFAULT_MAX_MB."""
  raw = os.environ.get("AOT_CACHE_MAX_MB", "")
  try:
    mb = float(raw) if raw else DEFAULT_MAX_MB
  except ValueError:
    mb = -1
  if mb < 0:
    from aot.errors import InvalidValueError

    raise InvalidValueError(f"AOT_CACHE_MAX_MB must be a number of megabytes >= 0, got {raw!r}")
  return int(mb * 1024 * 1024)


def fetch(cached: Path, dest: Path) -> bool:
  """Copy a cached file to dest if it is there; a hit counts as a use (its time is what a trim goes by)."""
  try:
    shutil.copyfile(cached, dest)
  except FileNotFoundError:
    return False
  try:
    os.utime(cached)
  except OSError:
    pass  # a read-only cache still serves
  return True


def store(path: Path, cached: Path) -> None:
  """Put a file into the cache atomically (concurrent builds may store the same key), unless it is too big for it
  (KEEP_MAX_SHARE)."""
  try:
    if os.path.getsize(path) > max_bytes() * KEEP_MAX_SHARE:
      return
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_name(f"{cached.name}.{os.getpid()}.{id(path)}.part")
    shutil.copyfile(path, part)
    os.replace(part, cached)
  except OSError:
    return  # a read-only cache only costs time
  for key, seen in _walked.items():
    if key[0] == str(cache_dir()):
      seen[2] += os.path.getsize(cached) if cached.exists() else 0


@dataclass(frozen=True)
class CacheUse:
  files: int
  bytes: int


def usage() -> CacheUse:
  files = _files()
  return CacheUse(len(files), sum(size for _, size, _ in files))


def trim() -> CacheUse:
  """Remove the least recently used files until the cache is under TRIM_TO of its cap; what was removed."""
  cap = max_bytes()
  seen = _walked.get((str(cache_dir()), cap))
  if seen is not None and seen[0] + seen[2] <= cap and time.monotonic() - seen[1] < WALK_EVERY_S:
    return CacheUse(0, 0)
  files = _files()
  total = sum(size for _, size, _ in files)
  _walked[str(cache_dir()), cap] = [total, time.monotonic(), 0]
  if total <= cap:
    return CacheUse(0, 0)
  removed = CacheUse(0, 0)
  for path, size, _ in sorted(files, key=lambda f: f[2]):
    if total <= cap * TRIM_TO:
      break
    try:
      path.unlink()
    except OSError:
      continue  # another process's trim took it first
    total -= size
    removed = CacheUse(removed.files + 1, removed.bytes + size)
  _walked[str(cache_dir()), cap][0] = total
  for d, _, _ in sorted(os.walk(cache_dir()), reverse=True):
    try:
      Path(d).rmdir()  # only the folders a trim emptied
    except OSError:
      pass
  return removed


def clear() -> CacheUse:
  """Remove the whole cache; what it held."""
  held = usage()
  shutil.rmtree(cache_dir(), ignore_errors=True)
  return held


def _files() -> list[tuple[Path, int, float]]:
  """Every finished file in the cache: (path, bytes, last use). Files still being written (.part) are not counted;
  os.walk passes over a folder or file that another build's trim removes while this one walks."""
  out = []
  for d, _, names in os.walk(cache_dir()):
    for name in names:
      if name.endswith(".part"):
        continue
      p = Path(d) / name
      try:
        st = p.stat()
      except OSError:
        continue
      out.append((p, st.st_size, st.st_mtime))
  return out
