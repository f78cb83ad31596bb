"""Train a drafter from a recipe.

    python train.py recipe=tiny-dspark [dotted.key=value ...] [--dry-run]
    python train.py --help
    accelerate launch train.py recipe=qwen3-8b

Everything lives in ``deepspec_train``; this file only hands the command line over.
"""

import sys

from deepspec_train.commands.train_entry import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
