"""aot.load: one loaded model shared by threads, close(), loading again after a recompile into the same folder, and the
messages for a folder that is not a whole artifact."""

import os
import threading

import numpy as np
import pytest

import aot
from aot.errors import ArtifactError, ModelClosedError

CALLERS, CALLS = 4, 100


def test_one_model_shared_by_threads_gives_each_call_its_answer(compiled_model):
  # the C instance runs one call at a time: without that, threads share its intermediate buffers and some answers
  # are another call's, or a mix, with no error
  art, model = compiled_model("mnist")
  xs = [model.example_inputs(seed)[0] for seed in range(8)]
  m = aot.load(art)
  want = [m(x) for x in xs]
  assert not np.array_equal(want[0], want[1])
  np.testing.assert_allclose(want[3], model.reference(xs[3]), rtol=1e-4, atol=1e-4)
  wrong = [0] * CALLERS

  def work(c: int):
    for i in range(CALLS):
      k = (c + i) % len(xs)
      if not np.array_equal(m(xs[k]), want[k]):
        wrong[c] += 1

  threads = [threading.Thread(target=work, args=(c,)) for c in range(CALLERS)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  m.close()
  assert wrong == [0] * CALLERS, f"{sum(wrong)} of {CALLERS * CALLS} answers differ from one call at a time"


def test_a_call_after_close_is_a_clear_error(compiled_model):
  art, model = compiled_model("mnist")
  m = aot.load(art)
  m.close()
  m.close()  # twice is nothing
  x = model.example_inputs(1)[0]
  with pytest.raises(ModelClosedError, match=r"mnist \(loaded from .*\) is closed: load it again"):
    m(x)
  with pytest.raises(ModelClosedError, match="is closed"):
    m.set_threads(2)


def test_close_waits_for_the_calls_under_way(compiled_model):
  # every call either finishes with its answer or, once close() has begun, is refused: none runs on a freed instance
  art, model = compiled_model("mnist")
  x = model.example_inputs(2)[0]
  m = aot.load(art)
  want = m(x)
  outcomes, busy, stop = [], threading.Barrier(CALLERS + 1), threading.Event()

  def work():
    got = m(x)
    outcomes.append(np.array_equal(got, want))
    busy.wait()
    while not stop.is_set():
      try:
        got = m(x)
      except ModelClosedError:
        return
      outcomes.append(np.array_equal(got, want))

  threads = [threading.Thread(target=work) for _ in range(CALLERS)]
  for t in threads:
    t.start()
  busy.wait()  # every thread has made a call and goes on calling
  # close() in a thread of its own, so that one waiting forever (for calls that keep coming) fails the test
  closing = threading.Thread(target=m.close, daemon=True)
  closing.start()
  closing.join(60)
  stop.set()  # where close() hangs, the callers stop (so that the test can end)
  assert not closing.is_alive(), "close() did not return while other threads kept calling"
  for t in threads:
    t.join()
  assert outcomes and all(outcomes)


def _double(x):
  return x * 2.0


def _plus_one(x):
  return x + 1.0


def _compile(fn, out_dir):
  return aot.compile_model(fn, [np.zeros((4, 8), np.float32)], out_dir=out_dir, name="m")


def test_recompiling_into_a_loaded_artifacts_folder_loads_the_new_build(tmp_path):
  # the dynamic loader knows a library by its path: loading the same path again returned the first build's code
  x = np.arange(32, dtype=np.float32).reshape(4, 8)
  first = aot.load(_compile(_double, tmp_path / "m"))
  np.testing.assert_array_equal(first(x), x * 2)
  second = aot.load(_compile(_plus_one, tmp_path / "m"))
  np.testing.assert_array_equal(second(x), x + 1)
  # the first is still its own build, and loading the folder again while both are open is the second
  np.testing.assert_array_equal(first(x), x * 2)
  third = aot.load(tmp_path / "m")
  np.testing.assert_array_equal(third(x), x + 1)
  for m in (first, second, third):
    m.close()
  # and nothing is left beside the artifact
  assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
    "libm.a",
    "libm.so",
    "m.h",
    "m.hpp",
    "m.json",
    "m.pc",
    "mConfig.cmake",
    "src",
  ]


def test_a_stale_library_in_a_folder_without_links_is_refused(tmp_path, monkeypatch):
  # where no hard link can be made (a read-only folder), the library is opened in place: a new build there while
  # the old is still loaded cannot be loaded beside it, and is refused rather than run as the old one
  def no_link(*args, **kwargs):
    raise PermissionError("read-only file system")

  monkeypatch.setattr(os, "link", no_link)
  x = np.arange(32, dtype=np.float32).reshape(4, 8)
  first = aot.load(_compile(_double, tmp_path / "m"))
  again = aot.load(tmp_path / "m")
  np.testing.assert_array_equal(again(x), x * 2)
  _compile(_plus_one, tmp_path / "m")
  with pytest.raises(ArtifactError, match=r"libm\.so was rebuilt while 2 model\(s\) loaded from its older build"):
    aot.load(tmp_path / "m")
  first.close()
  again.close()
  second = aot.load(tmp_path / "m")
  np.testing.assert_array_equal(second(x), x + 1)
  second.close()


def test_a_truncated_manifest_is_a_clear_error(tmp_path):
  art = _compile(_double, tmp_path / "m")
  text = (art.dir / "m.json").read_text()
  (art.dir / "m.json").write_text(text[: len(text) // 2])
  with pytest.raises(ArtifactError, match=r"m\.json is not a manifest aot can read \(truncated or damaged\?"):
    aot.load(art.dir)
  (art.dir / "m.json").write_text('{"name": "m"}')
  with pytest.raises(ArtifactError, match=r"m\.json is not a manifest aot can read: no 'target', 'arena_bytes'"):
    aot.load(art.dir)


def test_a_folder_missing_a_file_names_it(tmp_path):
  art = _compile(_double, tmp_path / "m")
  (art.dir / "m.h").unlink()
  with pytest.raises(ArtifactError, match=r"is not a whole artifact: m\.json is there, but not m\.h beside it"):
    aot.load(art.dir)
  art = _compile(_double, tmp_path / "m")
  (art.dir / "libm.so").unlink()
  with pytest.raises(ArtifactError, match=r"is not a whole artifact: libm\.so is missing"):
    aot.load(art.dir)
  with pytest.raises(ArtifactError, match="no such folder"):
    aot.load(tmp_path / "nothing")
  # a builtin caught before: still caught
  with pytest.raises(FileNotFoundError):
    aot.load(tmp_path)
