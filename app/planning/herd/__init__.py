"""Shepherd's HERD (shepherd-nsdi23.txt §4): the periodic planner grouping
request streams, models and devices into serving groups, each served by its
own FLEX core (app/simulation/grouped.py runs them in the simulator).

problem.py (inputs, T_i and n_i), plan.py (groups, burst tolerance, plan
files), ilp.py (the ILP on HiGHS), random_groups.py (the baseline),
config.py (YAML), cli.py (`python -m app plan herd`). T_i measured in the
simulator, an option, is app/simulation/herd_goodput.py."""
