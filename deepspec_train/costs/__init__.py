"""The cost model: what a recipe costs to train and to serve, computed from shapes (nothing is allocated).

Training sizing, by job: the stream payload of a nominal packing (``stream_payload``), the target's and the
drafter's parameters and FLOPs (``training_flops``), the split of a cluster's GPUs (``gpu_split``), memory per GPU
(``worker_memory``, its long-context terms in ``long_context_memory``), the reference targets and family recipes it
sizes (``reference_targets``), the docs' table rows (``sizing_tables``), drafter groups (``groups``) and the levers
anchor density and feature reuse (``levers``); ``python -m deepspec_train.costs`` prints the tables. Serving: the
roofline time of a round on named GPUs (``serving_cost``, ``gpu_specs``) from the kernel groups the kind records
compose (``kinds.serving_kernels``).
"""
