"""The engine layer: one model, one llama.cpp context and its engine thread (``Engine``), KV sequences in it
(``Sequence``), the work they run (``Job``, ``Rebase``), saved sequence state (``state``), the loading of the
C++ module (``loader``) and the versions it pins (``versions``), and the protocol a session needs of any
engine (``port``). Nothing here knows how a session compacts."""

from .arguments import physical_cores
from .engine import Engine
from .jobs import Job, Rebase
from .loader import native
from .sequence import BACKGROUND, FOREGROUND, PROBE, Sequence
from .versions import LLAMA_CPP_PYTHON_VERSION

__all__ = ["Engine", "Sequence", "Job", "Rebase", "physical_cores", "native", "LLAMA_CPP_PYTHON_VERSION",
           "FOREGROUND", "BACKGROUND", "PROBE"]
