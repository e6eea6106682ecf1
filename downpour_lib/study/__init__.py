"""Studies: the scaling study (a resumable sweep into one tidy CSV, and figures made from it) and the
Downpour staleness study of notebook 03 (``staleness``, ``staleness_plots``)."""
