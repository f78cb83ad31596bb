"""The data schedule both feature modes share: which sequences each optimizer step trains on (``steps.plan``), how
they are cut into target forwards and packed micro-batches (``steps.chunk_plan``, pure), and the one builder that
runs the target over a planned chunk (``steps.chunk_builder``). The colocated source, the target worker and the
streamed source all read their positions from here."""
