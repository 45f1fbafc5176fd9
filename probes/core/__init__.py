"""Machinery every probe shares; a probe package imports it and never copies it.

- `runner`: the one runner (settings, checkpoint expansion and roles, twins, stacks, resumable
  units, one results-store run) and the registry's `ProbeSpec`;
- `engine`: probes batched over layers (linear/MLP fitters), control tasks, majority baseline, MDL,
  scalar mix, tidy rows;
- `statistics`: the one bootstrap (over the data's independent unit, paired across rows) and the
  one AUC;
- `depth`: where in depth a task peaks (Tenney et al. 2019), with bootstrap CIs;
- `geometry`: Procrustes, CSLS, BLI, self-learning and linear CKA between vector spaces.
"""
