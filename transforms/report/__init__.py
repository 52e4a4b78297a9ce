"""Report and calibration math: figures and the linear cost-model fit."""
