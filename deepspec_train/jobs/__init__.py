"""Training jobs: ``jobs.run`` sets up one job of drafter groups (a plain run is a group of one), the colocated or
the streamed job trains them from the pieces of ``jobs.assembly``; and what the command line checks before a job
starts (``jobs.preflight``, ``jobs.run_directory``, ``jobs.drafter_groups``)."""
