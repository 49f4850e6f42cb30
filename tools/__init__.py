"""The tools around the model: benchmark, probe, Table 1, lm-eval, the GPU check, the
consolidation command."""
