#!/usr/bin/env python3
"""Multi-turn text-to-SQL RL for Qwen3.6-35B-A3B on one 8xH200 node (miles).

Thin over `t2sql.miles.train` (the `t2sql-train` command), where every setting lives in named blocks:

    python launcher/run_qwen3_6_35b_a3b_text_to_sql.py prepare --output-dir /data/t2sql --data-release /data/release
    python launcher/run_qwen3_6_35b_a3b_text_to_sql.py train --output-dir /data/t2sql --dry-run
    python launcher/run_qwen3_6_35b_a3b_text_to_sql.py train --output-dir /data/t2sql --wandb-project t2sql

With no subcommand it runs `train`. See docs/training.md.
"""

import sys

from t2sql.miles.train import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("prepare", "train", "-h", "--help"):
        argv = ["train", *argv]
    sys.exit(main(argv))
