"""The tools around the draft step: seeded rounds, timing, the roofline floor, the path
comparison, and the jobs of the commands (compile, verify, bench, sweep)."""
