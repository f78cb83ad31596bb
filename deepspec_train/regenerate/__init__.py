"""Regeneration: rewrite a prompt set's assistant turns with the target's own answers (the drafter is trained
on what the target says, not on what the dataset's original model said).

Modules: ``sampling`` (sampling parameters, from a recipe), ``backend`` (what the runner needs from a
backend), ``local_backend`` (a local transformers model, continuously batched by ``decode_loop`` over
``slot_cache``, tokens drawn by ``token_sampler``), ``http_backend`` (OpenAI-compatible servers with concurrency
and retries), ``openai_server`` (a minimal server over a local model), ``runner`` (resumable file-to-file
regeneration), ``progress`` (its progress bar), ``cli`` (the ``deepspec regenerate`` verb). Import them directly;
this package imports nothing heavy.
"""
