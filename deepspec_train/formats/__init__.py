"""File formats the pipeline's stages hand each other, one module per format, each the only writer and reader:
the trained-drafter directory (training -> export, evaluation), evaluation traces (eval -> calibrate, simulate,
compare), figures (PNG plots of every verb), and the drafter loader that rebuilds a module from a trained-drafter
directory or a serving export (``drafter_loader``, read by evaluation, export, calibration and the benchmarks)."""
