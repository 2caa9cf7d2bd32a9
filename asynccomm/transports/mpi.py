"""The MPI transport (mpi4py), public name.  mpi4py itself is imported when the first MPI
world opens, not when this module is imported; worlds are opened by ``ac.run`` under an MPI
launcher, or by ``asynccomm.open_mpi_world``."""

from __future__ import annotations

from ._mpi_transport import MPITransport as MPITransport

__all__ = ["MPITransport"]
