"""Hardware: what the machine offers, read once and cached.

    precision.py  "auto" precision and weights dtype from the device (resolve_precision, resolve_weights, autocast,
                  full_precision, describe_precision)

Import the module you need: this package imports none of them (precision.py imports torch).
"""
