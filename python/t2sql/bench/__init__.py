"""`t2sql bench`: the grading core and the serving path measured against their peers.

They ship in the wheel because `t2sql bench` is a command users run on their own machine and data;
benches/ in the repository holds the development-only scripts.
"""
