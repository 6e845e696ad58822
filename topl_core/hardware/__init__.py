"""Hardware: what the machine offers, read once and cached.

    precision.py  "auto" precision and weights dtype from the device (resolve_precision, resolve_weights, autocast,
                  full_precision, describe_precision)
    machine.py    the machine a measurement comes from (machine_key, machine_description) and the probes' timer
    linear_kernel.py  the CPU kernel of a decode step's float32 linears: aten's or oneDNN's, measured
                      (linear_kernel, use_linear_kernel: load_model applies it)

Import the module you need: this package imports none of them (precision.py imports torch).
"""
