"""``%%accelerate`` cells: the magic's flags, the cell turned into a worker function, the names
shipped to the workers and pulled back. Workers import ``magics.cell.runner``, so nothing here
imports IPython at module level except the kernel-only modules (arguments, flag_check)."""
