"""trtexec, NVIDIA's command-line builder and benchmark: its text output and exported JSON read into numbers."""
