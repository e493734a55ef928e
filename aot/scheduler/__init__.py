"""The scheduler: a traced graph cut into an ordered list of kernels (schedule), the kernel and buffer types it makes
(kernel), and the arena every scratch buffer is placed in (memory)."""
