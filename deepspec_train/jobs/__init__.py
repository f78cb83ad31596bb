"""Training jobs: the colocated and the streamed run (twins built from ``jobs.assembly``) and ``jobs.run``, which
picks one for a validated recipe."""
