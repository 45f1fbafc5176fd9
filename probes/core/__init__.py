"""Machinery every probe shares; a probe package imports it and never copies it.

- `runner`: the one runner (settings, checkpoint expansion and roles, twins, stacks, resumable
  units, one results-store run) and the registry's `ProbeSpec`;
- `fitting`: linear and MLP probes fitted for all layers as one batched program (`fit_probe`,
  `fit_probe_tasks`), their config and training loop, lazily built features;
- `baselines`: Hewitt & Liang (2019) control tasks, the majority class, the rows' baseline markers;
- `mdl`: the online code length of Voita & Titov (2020);
- `scalar_mix`: scalar mixes over layers (Peters et al. 2018) and Tenney et al. (2019)'s expected layer;
- `rows`: per-layer numbers as tidy rows of the results schema;
- `statistics`: the one bootstrap (over the data's independent unit, paired across rows) and the
  one AUC;
- `depth`: where in depth a task peaks (Tenney et al. 2019), with bootstrap CIs.

The maths of aligning vector spaces (Procrustes, CSLS, BLI, CKA) is the library's `workbench.geometry`:
the PEFT sweep, a driver, needs CKA too.
"""
