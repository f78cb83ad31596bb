"""Serving-format export of trained drafters and the loader that reads exports back.

``layouts`` says what each serving layout must contain (and validates it), ``exporter`` writes one
(``deepspec export``), ``loader`` rebuilds a drafter module from an export or from a training output directory.
"""
