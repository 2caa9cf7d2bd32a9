"""The cluster model: links, devices, presets, transfer costs and run records.

Re-exports only.  ``Cluster.preset(name)`` gives published hardware; ``ClusterModel`` plans
transfers on it in integer nanoseconds; ``summarize`` and ``format_table`` sum up a run;
``FaultPlan`` says what goes wrong on it (``open_world(..., fault_plan=)``).
"""

from __future__ import annotations

from .cluster import Cluster as Cluster
from .cluster import DeviceSpec as DeviceSpec
from .cluster import LinkSpec as LinkSpec
from .faults import FaultEvent as FaultEvent
from .faults import FaultPlan as FaultPlan
from .faults import LinkFault as LinkFault
from .faults import PlannedCrash as PlannedCrash
from .faults import RankFault as RankFault
from .host import HostSpec as HostSpec
from .model import ChunkPlan as ChunkPlan
from .model import ChunkTiming as ChunkTiming
from .model import ClusterModel as ClusterModel
from .model import DefaultStrategy as DefaultStrategy
from .model import Pipelined as Pipelined
from .model import Resource as Resource
from .model import StoreAndForward as StoreAndForward
from .model import Strategy as Strategy
from .model import TransferPlan as TransferPlan
from .model import adaptive_chunk as adaptive_chunk
from .records import OpRecord as OpRecord
from .records import PeerTotals as PeerTotals
from .records import RankSummary as RankSummary
from .records import format_table as format_table
from .records import summarize as summarize

__all__ = [
    "ChunkPlan",
    "ChunkTiming",
    "Cluster",
    "ClusterModel",
    "DefaultStrategy",
    "DeviceSpec",
    "FaultEvent",
    "FaultPlan",
    "HostSpec",
    "LinkFault",
    "LinkSpec",
    "OpRecord",
    "PeerTotals",
    "PlannedCrash",
    "Pipelined",
    "RankFault",
    "RankSummary",
    "Resource",
    "StoreAndForward",
    "Strategy",
    "TransferPlan",
    "adaptive_chunk",
    "format_table",
    "summarize",
]
