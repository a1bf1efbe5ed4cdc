"""Thin scripts that reproduce the chapter: load -> interp -> figures -> results/<experiment>/.

`python -m experiments.<name> [--model gpt-4] [--text ...] [--out DIR]` runs one;
`python -m experiments.run_all` runs them all and writes an index.html;
`python -m experiments.demo_table --readme README.md` regenerates the README's table of the demo models.
These are scripts run from a checkout: nothing imports them and the project does not install them.
"""
EXPERIMENTS = ["param_counts", "rope_check", "residual_growth", "logit_lens", "tuned_lens", "head_detection",
               "attention_maps", "induction_demo", "training_dynamics", "circuits", "features", "graphs"]
