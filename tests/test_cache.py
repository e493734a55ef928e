"""The build cache: capped by AOT_CACHE_MAX_MB (least recently used files go first), emptied by
compile-model --clear-cache, and a hit counts as a use."""

import os
import time

import numpy as np
import pytest

import aot
from aot import build, cache
from aot.cli import main
from aot.errors import InvalidValueError
from aot.models import get

MIB = 2**20


@pytest.fixture
def cache_at(tmp_path, monkeypatch):
  folder = tmp_path / "cache"
  monkeypatch.setenv("AOT_CACHE_DIR", str(folder))
  return folder


def _old_file(path, mib: float, age_s: float):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(b"\0" * int(mib * MIB))
  t = time.time() - age_s
  os.utime(path, (t, t))


def test_a_build_over_the_cap_removes_the_least_recently_used_files(cache_at, tmp_path, monkeypatch):
  for i, age in enumerate((300, 200, 100)):  # junk0 the oldest
    _old_file(cache_at / "old" / f"junk{i}", 1, age)
  monkeypatch.setenv("AOT_CACHE_MAX_MB", "3.5")
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "m")
  left = {p.name for p in cache_at.rglob("*") if p.is_file()}
  # 3 MiB of old files and the build's own (1.2 MiB: objects, libmnist.so, libmnist.a): over 3.5 MiB, trimmed to
  # 2.8 MiB from the oldest
  assert "junk0" not in left and "junk1" not in left and "junk2" in left
  assert {"lib.so", "libmnist.a"} <= left and cache.usage().bytes <= 3.5 * MIB
  # what is left still serves: a second build of the model is a hit
  x = np.ones(get("mnist").inputs[0][1], np.float32)
  np.testing.assert_allclose(aot.load(art)(x), get("mnist").reference(x), rtol=1e-4, atol=1e-5)


def test_a_file_over_a_quarter_of_the_cap_is_not_kept(cache_at, tmp_path, monkeypatch):
  _old_file(cache_at / "old" / "junk", 0.5, 100)
  monkeypatch.setenv("AOT_CACHE_MAX_MB", "1.5")
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "m")
  left = {p.name for p in cache_at.rglob("*") if p.is_file()}
  # libmnist.so and libmnist.a (0.45 MiB each, over 1.5 / 4) are not stored, where they would have evicted the rest
  assert art.library_path.stat().st_size > 1.5 * MIB / 4
  assert "junk" in left and not {"lib.so", "libmnist.a"} & left
  # the runtime's objects are kept
  assert any(p.suffix == ".o" for p in (cache_at / "obj").iterdir())


def test_a_hit_counts_as_a_use(cache_at, tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  (src / "a.c").write_text("int aot_answer(void) { return 42; }\n")
  out = tmp_path / "liba.so"
  assert build.build_library(src, ["a.c"], out) is False
  (lib,) = cache_at.glob("*/lib.so")
  os.utime(lib, (1, 1))
  assert build.build_library(src, ["a.c"], out) is True
  assert lib.stat().st_mtime > time.time() - 60


def test_a_cap_of_zero_keeps_nothing_past_the_build(cache_at, tmp_path, monkeypatch):
  monkeypatch.setenv("AOT_CACHE_MAX_MB", "0")
  aot.compile_model("models:mlp", out_dir=tmp_path / "m")
  assert cache.usage().files == 0 and (tmp_path / "m" / "libmlp.so").exists()


def test_a_bad_cap_names_the_variable(cache_at, monkeypatch):
  monkeypatch.setenv("AOT_CACHE_MAX_MB", "lots")
  with pytest.raises(InvalidValueError, match="AOT_CACHE_MAX_MB must be a number of megabytes >= 0, got 'lots'"):
    cache.max_bytes()


def test_clear_cache_empties_it_without_a_model(cache_at, capsys):
  _old_file(cache_at / "obj" / "x.o", 0.5, 0)
  with pytest.raises(SystemExit) as done:
    main(["--clear-cache"])
  assert done.value.code == 0
  assert capsys.readouterr().out.strip() == f"removed 1 files (0.5 MiB) from {cache_at}"
  assert not cache_at.exists()


def test_the_cache_is_under_xdg_cache_home_unless_aot_cache_dir_says(tmp_path, monkeypatch):
  monkeypatch.delenv("AOT_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert cache.cache_dir() == tmp_path / "aot-compiler"


def test_prebuilt_runtime_objects_are_the_ones_the_build_makes(cache_at, tmp_path, monkeypatch):
  # compile_model starts the runtime's slowest files compiling at once (aot/build.py prebuild_runtime) with the key
  # and command build_library would use, and the build takes them: the library is the same bytes as one built with
  # no prebuild, and the prebuilt objects were taken, not compiled again
  # (a prebuild an earlier compile in this process left untaken is not this test's)
  monkeypatch.setattr(build, "_prebuilt", {})
  taken = []
  take = build._take_prebuilt

  def counted(key: str, o: str) -> bool:
    if took := take(key, o):
      taken.append(key)
    return took

  monkeypatch.setattr(build, "_take_prebuilt", counted)
  with_prebuild = aot.compile_model("models:mlp", out_dir=tmp_path / "a", cache=False)
  assert len(taken) == len([s for s in build.PREBUILT if (with_prebuild.dir / "src" / s).exists()]) > 0
  assert not build._prebuilt
  monkeypatch.setattr(build, "PREBUILT", ())
  without = aot.compile_model("models:mlp", out_dir=tmp_path / "b", cache=False)
  assert (with_prebuild.dir / "libmlp.so").read_bytes() == (without.dir / "libmlp.so").read_bytes()
