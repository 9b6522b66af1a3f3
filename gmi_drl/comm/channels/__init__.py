"""Experience channels of asynchronous training (GMI-DRL §4.2): shared-memory rings
(`ring`), the block that holds a run's channels (`fabric`) and the dispenser, compressor,
migrator and batcher (`experience`)."""

from gmi_drl.comm.channels.experience import Batcher, Dispenser, choose_trainer
from gmi_drl.comm.channels.fabric import ChannelPlan, Fabric, FieldSpec
from gmi_drl.comm.channels.ring import ChannelClosed, SlotRing

__all__ = ["Batcher", "ChannelClosed", "ChannelPlan", "Dispenser", "Fabric", "FieldSpec",
           "SlotRing", "choose_trainer"]
