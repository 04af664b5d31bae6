"""The sans-IO core of docket: pure state machines and decisions.

Nothing in this package performs I/O, reads a clock or draws random numbers:
time comes in as ``now``, deadlines go out as numbers, and every action on the
store or on running tasks goes out as an effect value.
"""
