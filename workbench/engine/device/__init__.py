"""Device primitives below every engine: pinned host buffers, CUDA streams, and the host memory
the ranks of a node share."""
