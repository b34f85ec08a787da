"""Symphony's partitioning of models into sub-clusters (symphony.txt §4.7,
App. A): the problem (problem.py), the MILP on HiGHS (milp.py), the random
baseline of App. A.2 (random_solver.py), plans (plan.py), the YAML input
(config.py) and `python -m app plan partition` (cli.py)."""
