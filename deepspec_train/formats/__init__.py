"""File formats the pipeline's stages hand each other, one module per format, each the only writer and reader:
the trained-drafter directory (training -> export, evaluation), evaluation traces (eval -> calibrate, simulate,
compare) and figures (PNG plots of every verb)."""
