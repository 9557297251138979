"""rlplan planner: plan schema, verl rules, memory and step-time models, solver. Imports no torch."""
