"""Target families (Qwen3, Llama 3, Gemma 3, GPT-OSS, DeepSeek-V3 / Kimi-K2) as records: ``records`` defines
them, ``catalog`` holds the known ones and ``family_of(config)`` finds a target's. Imports nothing else of the
package, so every layer may read it."""
