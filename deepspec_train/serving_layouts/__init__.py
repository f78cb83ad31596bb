"""Serving layouts: one ``ServingLayout`` record per format a family of serving-engine loaders reads (config.json +
model.safetensors), looked up by name in ``layout_registry``; what each engine reads of an export and captures of
the target (``engine_reading``), and the config and tensor checks the layouts share. The drafter kinds
(``deepspec_train.kinds``) name the layouts they export to; nothing here imports them."""
