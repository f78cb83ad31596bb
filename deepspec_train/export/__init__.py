"""Serving-format export of trained drafters.

``exporter`` writes one (``deepspec export``) in a serving layout, whose record (``serving_layouts.layout_registry``)
says what it must contain; ``engine_rules`` runs the layout's engine readers (captured layers, refused tensors, needed
fields, serve lines) and refuses an export an engine would misread; ``export_readme`` writes the export's README,
``engine_files`` SGLang's STS / SPS side files, and ``production_plans`` plans the production recipes' exports at
real shapes. The loader that reads exports back is ``formats.drafter_loader``.
"""
