"""Serving-format export of trained drafters and the loader that reads exports back.

``layouts`` says what each serving layout must contain (and validates it), ``engine_rules`` what vLLM and SGLang
make of an export (captured layers, refused tensors, needed fields, serve lines), ``exporter`` writes one
(``deepspec export``), ``loader`` rebuilds a drafter module from an export or from a training output directory,
``engine_files`` writes SGLang's STS / SPS side files, ``zlab_dflash_modeling`` is the modeling code shipped in
z-lab exports, and ``production_plans`` plans the production recipes' exports at real shapes.
"""
