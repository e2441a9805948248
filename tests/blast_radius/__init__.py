"""One poisoned item in a live workload stalls only itself: a test per long-running component."""
