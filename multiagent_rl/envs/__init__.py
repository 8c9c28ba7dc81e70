"""Built-in environments. Each module is one environment that reads like its rules."""
