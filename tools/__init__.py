"""Commands that run no Beam pipeline: validate, report, calibrate."""
