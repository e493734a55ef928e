"""Every error aot raises on purpose, under one base. A CompileError is the user's to fix (a model, a program, an
option); a BuildError or an InternalError is ours (a C compiler failing on generated code, a bug in a pass).

Where a builtin exception was raised before a class here existed, the class also derives from it (ValueError,
TypeError, IndexError), so that callers catching the builtin keep working.
"""

from __future__ import annotations

from contextlib import contextmanager


class AotError(Exception):
  """Anything aot raises on purpose; any other exception escaping aot is a bug."""


class CompileError(AotError):
  """A problem in the user's program or model, stated so they can act on it. needs_inputs names the model inputs
  whose values would let it compile (pin them with --bind, or compile_model(bind=...)); needs_shapes those whose
  shapes would (a sequence's length, a dim_param: shapes=...), which a caller holding example values can pin."""

  def __init__(
    self,
    msg: str,
    needs_inputs: set[str] | frozenset[str] = frozenset(),
    needs_shapes: set[str] | frozenset[str] = frozenset(),
  ):
    super().__init__(msg)
    self.needs_inputs, self.needs_shapes = frozenset(needs_inputs), frozenset(needs_shapes)


class InvalidValueError(CompileError, ValueError):
  """A value an op cannot take: a shape, axis or size that does not fit (a reshape to another element count), an
  unknown mode."""


class InvalidTypeError(CompileError, TypeError):
  """An argument of the wrong type or count: a dtype an op does not take, a call with the wrong number of arguments."""


class InvalidIndexError(CompileError, IndexError):
  """A Tensor index that does not fit its shape."""


class Unsupported(CompileError):
  """This node cannot be compiled as it is (an attribute, a dtype, a value that must be known at compile time); the
  ONNX frontend collects one per node and reports them together."""


class NeedsConstant(Unsupported):
  """A value that must be known at compile time depends on a model input (which --bind can pin)."""

  def __init__(self, msg: str, input_name: str):
    super().__init__(msg, {input_name})
    self.input_name = input_name


class InternalError(AotError):
  """A bug in the compiler (an exception from our own code while compiling one node, say), not the user's fault."""


# what a bug's InternalError says of it, after where: the user cannot fix it by changing the model
BUG_REPORT = "(a bug in the compiler, not in the model: please report it)"


@contextmanager
def working_on(place: str):
  """Say what the code inside works on ("in kernel k3_r_1_64", "while scheduling"), for the InternalError that
  compile_model makes of an exception escaping it: each place the exception leaves is added to its `aot_places`,
  innermost first (places_of), so the message reads "internal compiler error in kernel ... while rendering ..."."""
  try:
    yield
  except Exception as e:
    try:
      e.aot_places = (*places_of(e), place)
    except (AttributeError, TypeError):  # an exception type that takes no attributes: named without the place
      pass
    raise


def places_of(e: BaseException) -> tuple[str, ...]:
  """The places (working_on) an exception was raised in, innermost first."""
  return getattr(e, "aot_places", ())


class BuildError(AotError):
  """The C compiler or linker failed on generated code (a compiler bug, not the user's)."""


class MissingToolError(BuildError, RuntimeError):
  """A compiler or SDK a target needs is not installed."""


class InputError(AotError):
  """An array passed to a loaded model does not fit the input it is passed as."""

  def __init__(self, msg: str, input_name: str, expected, got):
    super().__init__(msg)
    self.input_name, self.expected, self.got = input_name, expected, got


class InputShapeError(InputError, ValueError):
  """An input array of the wrong shape."""


class InputDtypeError(InputError, TypeError):
  """An input array of the wrong dtype."""


class IndexRangeError(AotError, IndexError):
  """A run given an index outside the axis it indexes (an ONNX Gather's indices, an embedding's token id): the
  artifact clamps it, computes, and fails with AOT_ERR_INDEX_RANGE; the message names the input (or the Gather node
  and its indices), the bad value's position and the valid range."""


class InputCountError(AotError, TypeError):
  """A loaded model called with the wrong number of inputs, or fed by names it does not have (or missing one)."""


class RunError(AotError, RuntimeError):
  """A loaded model's NAME_create or NAME_run returned a status other than AOT_OK (other than an index out of range):
  status is that code, the message the library's own (NAME_last_error)."""

  def __init__(self, msg: str, status: int):
    super().__init__(msg)
    self.status = status


class InvalidArgumentError(RunError, ValueError):
  """A loaded model's call refused a value (AOT_ERR_INVALID_ARGUMENT): a thread count below 1."""


class UnsupportedCpuError(RunError):
  """NAME_create on a CPU that lacks an instruction set extension the library was compiled for (--cpu native on a
  newer machine, say): the message names the missing extensions and the --cpu the library was built for."""


class ArtifactError(AotError, FileNotFoundError):
  """A folder that is not a whole artifact: a file missing, or a manifest that does not parse."""


class ModelClosedError(AotError, ValueError):
  """A loaded model used after its close()."""


class KernelCountException(AotError, AssertionError):
  """The number of kernels a model compiles to changed (aot.testing.assert_kernel_count)."""

  def __init__(self, expected: int, got: int):
    super().__init__(f"expected {expected} kernels, got {got}")
    self.expected, self.got = expected, got
