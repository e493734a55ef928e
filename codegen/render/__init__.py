"""Rendering: kernel ASTs to C, LLVM IR or GPU source, and the host code (model.c) that calls them in order."""
