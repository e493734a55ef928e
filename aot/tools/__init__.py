"""Developer tools over the compiler, never imported by `import aot`: the bench, the profiler's runner, the fuzzer and
its graph generators, the scale bench and the ONNX backend-test adapter."""
