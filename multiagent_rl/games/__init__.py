"""Game rules, below the environments that prompt them and the evaluations that score them."""
