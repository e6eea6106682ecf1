"""The performance model: one worker's step of each algorithm at N workers, on hardware given as
input.

===============  ==============================================================================
module           what it holds
===============  ==============================================================================
``netmodel``     alpha-beta links and the time of each communication pattern on them
``calibration``  ``Workload``, ``Calibration``, ``Prediction``: what a prediction reads and writes
``perfmodel``    ``predict``: a step from what each algorithm declares it sends (its options'
                 ``traffic``, read from the registry); ``relative``: one prediction against
                 another on the same hardware, each end of the unknowns over the same end
``terms``        the terms the network alone misses, each with its fitted value and source
``perfsim``      the discrete-event simulation of the asynchronous algorithms
``hardware``     hardware YAML files (``hardware/*.yaml``, the presets) -> ``Calibration``
``presets``      the presets and the published results they are checked against
``checks_file``  your own results (a CSV) as checks, as the presets' are
``calibrate``    a ``Calibration`` fitted to this machine's measurements, and compared with them
===============  ==============================================================================

``downpour model ...`` (``cli.model``) is its command line; ``study.model_plots`` and
``study.model_validate`` set it beside the studies.
"""
