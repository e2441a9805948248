"""Small runnable programs built on estafeta."""
