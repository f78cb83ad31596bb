"""Data pipeline: read rows of any supported shape, render them (with the target's chat template, or as plain
text), build loss masks from message boundaries, and tokenise them once into cached Arrow shards.

Modules: ``conversations`` (file readers and ShareGPT/OpenAI normalisation), ``row_shapes`` (the row shapes,
one record each) and ``shape_detection`` (``data.format=auto``, per source), ``supervision`` (how content is
supervised) with ``loss_mask`` (chat rendering with an assistant-only mask), ``plain_text`` (``text`` rows) and
``turn_markers`` (pre-rendered chat text), ``chat_templates`` (``data.chat_template``; the ChatML template the
tiny world ships is ``chatml_template``), ``token_shards`` (the cached tokenised dataset) with ``data_summary``
(what it kept and skipped) and ``usable_rows`` (the one-line refusal of data a run cannot use). Import them
directly; this package imports nothing heavy.
"""
