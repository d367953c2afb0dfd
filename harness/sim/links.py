"""The links KV transfers cross between engines: a transfer takes a setup latency plus its bytes over
the NIC bandwidth of the engine's GPUs times an efficiency, FIFO on the sender's and the receiver's
NICs (simulator references: Frontier, splitwise-sim)."""
from __future__ import annotations

from mypy_extensions import mypyc_attr

from harness.cluster import ClusterConfig


@mypyc_attr(serializable=True, allow_interpreted_subclasses=True)
class KVLinks:
    def __init__(self, cluster: ClusterConfig, engines: int):
        self.free = [0.0] * engines   # when each engine's NICs finish what they were given
        self.setup_s = cluster.kv_transfer_setup_s
        self.bytes_per_token = cluster.model.kv_bytes_per_token
        # a weighted sequence's KV is that many sequences' bytes (ClusterConfig.weighted)
        self.bw = cluster.gpus_per_engine * cluster.gpu.nic_bw * cluster.perf.nic_efficiency / cluster.sequence_weight

    def transfer(self, now: float, src: int, dst: int, tokens: int) -> float:
        """When `tokens` tokens of KV sent from engine `src` to `dst` at `now` have arrived."""
        start = max(now, self.free[src], self.free[dst])
        end = start + self.setup_s + tokens * self.bytes_per_token / self.bw
        self.free[src] = self.free[dst] = end
        return end
