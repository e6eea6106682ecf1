"""Studies, all of one shape (``core``): a plan, checked before anything runs -> the runs, through one
resumable loop into one tidy CSV per study (one row per run, with its provenance; companion tables
keyed by run id) -> figures made from the CSVs alone.

=============  ===========================  ========================  ============
study          plan and runs                figures                   notebook
=============  ===========================  ========================  ============
scaling        ``scaling`` (``StudySpec``)  ``scaling_plots``         02
staleness      ``staleness``                ``staleness_plots``       03
gossip         ``gossip``                   ``gossip_plots``          04
accuracy       ``accuracy``                 ``accuracy_plots``        05
lm             ``accuracy`` (loss target)   ``accuracy_plots``        07
=============  ===========================  ========================  ============

Each is a ``protocol.Study`` (plan, measure, tables, figures; ``studies.Scaling``, ``Staleness``,
``Gossip``, ``Accuracy``, ``TimeToLoss``), and one ``run_study(study)`` runs any of them
(``downpour study``, the notebooks). Each writes ``results/<host>/<study>/`` (``runs.csv``, its
companions, ``figures/``); the committed references are ``results/reference/<study>/``.
``run_plots`` draws one run's figures (notebook 01). The scaling figures read their table from
``scaling_runs``; ``scaling_model_plots`` sets them beside the performance model.
"""
