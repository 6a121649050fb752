"""The grader benchmark as a script: `python benches/bench_grader.py [--rows N,...]`.

Same as `t2sql bench grader`; kept here so benchmarks live beside the tests.
"""

import sys

from t2sql.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "grader", *sys.argv[1:]]))
