"""Scores: sacreBLEU metrics, validation during training and `tmt evaluate`."""
