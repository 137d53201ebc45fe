"""`tmt sweep`: the paper's Table 3 variations of a config, trained and tabulated."""
