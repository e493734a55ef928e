"""LLVM IR text optimised and emitted as an object file, with llvmlite alone: run as a script, one process a module,
so that a model's modules compile in parallel (llvmlite serialises its calls behind one lock: threads ran them one
after another, YOLOv8n's 3.1 s of LLVM work on one core). The CPU and features come resolved (codegen/render/llvm.py
object_target)."""

from __future__ import annotations

import sys

import llvmlite.binding as llvm


def emit_object(ir_text: str, triple: str, cpu: str, features: str) -> bytes:
  """The object file of the module ir_text for triple, cpu and features, optimised at -O3 with both vectorisers."""
  llvm.initialize_all_targets()
  llvm.initialize_all_asmprinters()
  target = llvm.Target.from_triple(triple)
  tm = target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic", codemodel="default")
  mod = llvm.parse_assembly(ir_text)
  mod.triple, mod.data_layout = triple, str(tm.target_data)
  mod.verify()
  pto = llvm.create_pipeline_tuning_options(speed_level=3)
  pto.loop_vectorization = pto.slp_vectorization = True
  pb = llvm.create_pass_builder(tm, pto)
  mpm = pb.getModulePassManager()
  try:
    mpm.run(mod, pb)
    return tm.emit_object(mod)
  finally:
    # dispose in dependency order: the pass builder refers to the target machine, and Python's collector would free
    # them in any order (a freed target machine under a live pass builder corrupts the heap)
    mpm.close()
    pb.close()
    pto.close()
    mod.close()
    tm.close()


if __name__ == "__main__":
  src, out, triple, cpu, features = sys.argv[1:6]
  with open(src) as f:
    obj = emit_object(f.read(), triple, cpu, features)
  with open(out, "wb") as f:
    f.write(obj)
