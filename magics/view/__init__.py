"""The widget live view of a launch in a kernel: status, progress bars and metric plots
(the text view lives in the engine, ``notebook_accel.launch``)."""
