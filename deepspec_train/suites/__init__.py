"""The published benchmark suites (GSM8K, MATH-500, AIME, HumanEval, MBPP, LiveCodeBench, MT-Bench, Alpaca,
Arena-Hard) turned into the evaluator's prompt files from the dataset files a user has on disk."""
