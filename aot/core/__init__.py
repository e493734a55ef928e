"""The IR core: one hash-consed graph of UOps (ir), its dtypes, rewrite rules, symbolic index algebra and a reference
interpreter that evaluates constant subgraphs. Imports nothing else of aot but errors."""
