"""The scaling study's old module name, kept so that ``bench/train.py`` (``StudyError``,
``mpiexec_launch``) and existing notebooks keep importing. The scaling plan lives in
``study.scaling``, the shared loop and the mpiexec launcher in ``study.core``: import from there.
"""

from .scaling import *  # noqa: F403
from .scaling import __all__  # noqa: F401
