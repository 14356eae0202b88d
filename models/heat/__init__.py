"""Learning heat: tuning the decay online (this package), the heat-evolution GAN (issue 5)."""
